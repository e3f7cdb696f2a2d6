"""Load shedding: a `/v1` request that waited longer than DUETIME_SHED_QUEUE_MS for a thread
of its gunicorn worker is answered 503 problem+json (`overloaded`, Retry-After: 1) at once,
before any other work, instead of being served late.

The wait is measured by the worker (app.gunicorn_conf.ClientDeadlineWorker) from the moment
the connection was queued for a thread to the moment one took it. Consuming calls (lease,
ack, nack, extend) are never shed: they are what drains the backlog, and a long poll holds
its thread by design. Health, readiness and metrics are not under /v1 and are never shed.
"""

from __future__ import annotations

from flask import Flask, request

from app.errors import Overloaded
from app.ops import metrics

WAITED_KEY = "HTTP_X_DUETIME_QUEUED_MS"  # app.gunicorn_conf.QUEUED_HEADER in the environ
CONSUMING = ("/leases", "/ack", "/acks", "/nack", "/extend")


def register(app: Flask, shed_queue_ms: int) -> None:
    """Install the check (registered before authentication: a shed request costs nothing
    more). shed_queue_ms <= 0: never shed."""
    @app.before_request
    def shed_when_behind() -> None:
        if shed_queue_ms <= 0 or not request.path.startswith("/v1/"):
            return
        if request.path.endswith(CONSUMING):
            return
        waited = request.environ.get(WAITED_KEY, "")
        if waited.isdigit() and int(waited) > shed_queue_ms:
            metrics.REQUESTS_SHED.inc()
            raise Overloaded(f"This API process is behind (the request waited {waited} ms "
                             f"for a thread, over {shed_queue_ms} ms); retry in a moment.")
