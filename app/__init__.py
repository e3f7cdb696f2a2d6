"""duetime: a timeline scheduling service on Apache Cassandra.

create_app(config) builds the Flask application; nothing connects to Cassandra until the
first request that needs it (so gunicorn workers connect after fork).
"""

from __future__ import annotations

import time

from flask import Flask, Response, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from app import dashboard
from app.api import docs_assets, encoded_slash, openapi_file, problems, validation
from app.api.auth import Authenticator
from app.config import Config, load_config
from app.errors import PayloadTooLarge
from app.messages import group_commit
from app.ops import logs, metrics, shedding
from app.ops.quotas import Quotas
from app.services import Clock, Services, system_clock_ms

API_VERSION = "1.0.0"
PUBLIC_PREFIXES = ("/healthz", "/readyz", "/openapi", "/docs")


def _smorest_settings(app: Flask, config: Config) -> None:
    app.config.update(
        API_TITLE="duetime",
        API_VERSION=API_VERSION,
        OPENAPI_VERSION="3.1.0",
        OPENAPI_URL_PREFIX="/",
        OPENAPI_JSON_PATH="openapi.json",
        OPENAPI_SWAGGER_UI_PATH="/docs",
        OPENAPI_SWAGGER_UI_URL=docs_assets.ASSETS_URL,
        MAX_CONTENT_LENGTH=config.max_batch * (config.max_payload_bytes + 4096) + 65536,
        API_SPEC_OPTIONS={
            "info": {"description": "Messages delivered at their moment. See README.md. "
                                    "Every answer carries X-Request-Id: the request's own "
                                    "(1-128 of A-Z a-z 0-9 . _ : -) or a new one, also in "
                                    "the API's log events. Each /v1 request, and each "
                                    "message enqueued, counts against its tenant's quota "
                                    "where one is set (DUETIME_RATE_LIMIT_PER_S, "
                                    "DUETIME_MESSAGE_RATE_LIMIT_PER_S): past it the answer "
                                    "is 429 problem+json (type .../rate-limited) with "
                                    "Retry-After in seconds."},
            "components": {"securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "API key"},
            }},
        },
    )


def _observe_requests(app: Flask) -> None:
    """Each request's latency, timed once: its histogram (app.ops.metrics) and its log event with
    its request id (app.ops.logs)."""
    @app.before_request
    def start() -> None:
        g.started = time.perf_counter()
        logs.assign_request_id()

    @app.after_request
    def done(response: Response) -> Response:
        started = g.get("started")
        if started is not None:
            latency_s = time.perf_counter() - started
            metrics.HTTP_DURATION.labels(
                request.endpoint or "unknown", request.method,
                f"{response.status_code // 100}xx").observe(latency_s)
            logs.log_request(response, latency_s)
        metrics.flush_collections()
        return response


def _authenticate(app: Flask, authenticator: Authenticator, quotas: Quotas) -> None:
    """Every /v1 request: its tenant from its key, then one request of the tenant's quota."""
    @app.before_request
    def require_key() -> None:
        if request.path.startswith("/v1/"):
            g.tenant = authenticator.tenant_for_header(request.headers.get("Authorization"))
            quotas.admit(g.tenant, "requests")


def _limit_unsized_bodies(app: Flask) -> None:
    """A body sent without Content-Length (chunked) is read before any parsing, and only up
    to MAX_CONTENT_LENGTH: past it the answer is 413 problem+json (the parsers would see a
    body cut at the limit and answer 400 invalid JSON), and the rest is never read."""
    @app.before_request
    def read_within_limit() -> None:
        if request.content_length is not None or request.method not in ("POST", "PUT", "PATCH"):
            return
        limit = app.config["MAX_CONTENT_LENGTH"]
        try:
            over = len(request.get_data(cache=True)) >= limit
        except RequestEntityTooLarge:
            over = True
        if over:
            raise PayloadTooLarge(f"The body is over the limit of {limit} bytes.")


def create_app(config: Config | None = None, clock: Clock = system_clock_ms) -> Flask:
    """The WSGI application for config (default: from the DUETIME_* environment)."""
    config = config or load_config()
    metrics.time_collections()
    app = Flask(__name__)
    _smorest_settings(app, config)
    services = Services(config, clock)
    app.extensions["duetime"] = services
    app.extensions["duetime_groups"] = {"enqueue": group_commit.enqueue_groups(services),
                                        "ack": group_commit.ack_groups(services)}
    smorest = openapi_file.DuetimeApi(app)
    validation.register(app, smorest)
    # imported here, not at module level: names bound there are attributes of the package
    # and would shadow the packages app.topics, app.messages, app.campaigns and
    # app.schedules
    from app.api import (
        campaigns,
        health,
        leases,
        messages,
        operations,
        schedules,
        topics,
    )

    for module in (health, topics, messages, leases, campaigns, operations, schedules):
        smorest.register_blueprint(module.blp)
    openapi_file.register(app, smorest)
    docs_assets.register(app)
    dashboard.register(app)
    problems.register(app)
    _observe_requests(app)
    shedding.register(app, config.shed_queue_ms)
    _authenticate(app, Authenticator(services.keys, config.key_cache_s), services.quotas)
    _limit_unsized_bodies(app)
    encoded_slash.register(app)  # last: every other hook has run
    return app
