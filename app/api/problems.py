"""The one place that turns failures into application/problem+json (RFC 9457) answers."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, json, request
from gunicorn.http.errors import NoMoreData
from werkzeug.exceptions import ClientDisconnected, HTTPException

from app.errors import DuetimeError, RateLimited, StoreUnavailable

log = logging.getLogger(__name__)
PROBLEM_TYPE_BASE = "https://duetime.dev/problems/"


def problem_fields(status: int, title: str, detail: str, slug: str,
                   errors: dict[str, Any] | None = None) -> dict[str, Any]:
    """An RFC 9457 problem's members (also a batch item's `error`)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug, "title": title, "status": status, "detail": detail,
    }
    if errors:
        body["errors"] = errors
    return body


def error_fields(error: DuetimeError) -> dict[str, Any]:
    """The problem members of a domain error, as its own answer would carry them."""
    return problem_fields(error.status, error.title, error.detail, error.slug, error.errors)


def problem(
    status: int, title: str, detail: str, slug: str,
    errors: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
) -> Response:
    body = problem_fields(status, title, detail, slug, errors)
    response = Response(json.dumps(body), status=status, mimetype="application/problem+json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _from_domain(exc: DuetimeError) -> Response:
    headers = {}
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(exc.retry_after_s)
    elif isinstance(exc, StoreUnavailable):
        headers["Retry-After"] = str(exc.retry_after_s)
        log.warning("store unavailable: %s", exc.detail)
    return problem(exc.status, exc.title, exc.detail, exc.slug, exc.errors, headers)


def _from_http(exc: HTTPException) -> Response:
    status = exc.code or 500
    data = getattr(exc, "data", None) or {}
    messages = data.get("messages") if isinstance(data, dict) else None
    if messages:  # webargs: {"json": {field: [msg]}}, or {"json": [msg]} for a bad body
        errors: dict[str, Any] = {}
        for location, location_errors in messages.items():
            if isinstance(location_errors, dict):
                errors.update(location_errors)
            else:
                errors[location] = location_errors
        if "json" in errors and not isinstance(messages.get("json"), dict):
            return problem(400, "Malformed request", "The body is not valid JSON.",
                           "malformed-request", errors)
        return problem(400, "Invalid request", "The request has invalid fields.",
                       "invalid-request", errors)
    if status == 400:
        return problem(400, "Malformed request", exc.description or "Malformed request body.",
                       "malformed-request")
    title = exc.name or "Error"
    detail = exc.description or title
    # the exception's own headers: a 405's Allow (RFC 9110 requires it), a 401's challenge
    kept = {name: value for name, value in exc.get_headers()
            if name.lower() != "content-type"}
    return problem(status, title, detail, title.lower().replace(" ", "-"), headers=kept)


def _too_deep(exc: RecursionError) -> Response:
    """JSON nested deeper than the interpreter's recursion limit (about 1,000 levels) fails
    in the parser or the encoder: the client's doing, so a 400, not a 500."""
    if request.is_json:
        return problem(400, "Malformed request", "The JSON body is nested too deeply.",
                       "malformed-request", {"json": ["Nested too deeply."]})
    return _unexpected(exc)


def _body_cut_short(exc: NoMoreData | ClientDisconnected) -> Response:
    """The body did not arrive: the client stopped sending it, or sent it too slowly
    (app.gunicorn_conf, DUETIME_CLIENT_TIMEOUT_S)."""
    return problem(408, "Request timeout", "The request body did not arrive in time.",
                   "request-timeout")


def _unexpected(exc: Exception) -> Response:
    log.exception("unhandled error")
    return problem(500, "Internal error", "An unexpected error occurred; it has been logged.",
                   "internal")


def register(app: Flask) -> None:
    """Install the handlers: domain errors, HTTP errors (404, 405, 413, validation), the rest."""
    app.register_error_handler(DuetimeError, _from_domain)
    app.register_error_handler(HTTPException, _from_http)
    app.register_error_handler(RecursionError, _too_deep)
    app.register_error_handler(NoMoreData, _body_cut_short)
    app.register_error_handler(ClientDisconnected, _body_cut_short)
    app.register_error_handler(Exception, _unexpected)
