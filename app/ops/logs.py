"""Logging of the API and the releasers: one event a line, JSON (DUETIME_LOG_FORMAT=json, the
default) or plain text (`text`, what `make run` and `make up` use).

Inside a request every event carries its request id (the client's X-Request-Id, else a new
one; answered in X-Request-Id), the tenant, and the topic and message id of the route. Each
request ends with one `request` event: method, path, status and latency_ms; at level info for
a 4xx answer, warning for a 5xx, debug for a success (shown with DUETIME_LOG_LEVEL=debug: a
line per message is a busy data plane's largest log cost, and /metrics counts every request).
API keys, payloads and headers are never logged.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import secrets

from flask import Response, g, has_request_context, request

FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warning", "error")
CONTEXT_FIELDS = ("request_id", "tenant", "topic", "message_id")
REQUEST_FIELDS = ("method", "path", "status", "latency_ms")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
log = logging.getLogger("duetime.requests")


class RequestContext(logging.Filter):
    """Adds the current request's context fields to every record made inside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context():
            view_args = request.view_args or {}
            values = {"request_id": g.get("request_id"), "tenant": g.get("tenant"),
                      "topic": view_args.get("topic"), "message_id": view_args.get("message_id")}
            for name, value in values.items():
                if value is not None and not hasattr(record, name):
                    setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", the context and request fields present,
    "error" with the traceback of an exception}."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage()}
        for name in CONTEXT_FIELDS + REQUEST_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                event[name] = value
        if record.exc_info:
            event["error"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


class TextFormatter(logging.Formatter):
    """The plain line, then the context and request fields present as name=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{name}={getattr(record, name)}"
                         for name in CONTEXT_FIELDS + REQUEST_FIELDS
                         if getattr(record, name, None) is not None)
        return f"{line} {extra}" if extra else line


def configure(fmt: str | None = None, level: str | None = None) -> None:
    """Send every logger's events at `level` and above (default DUETIME_LOG_LEVEL, else
    info) to stderr, one a line, in fmt (default DUETIME_LOG_FORMAT, else json)."""
    fmt = fmt or os.environ.get("DUETIME_LOG_FORMAT") or "json"
    if fmt not in FORMATS:
        raise ValueError(f"DUETIME_LOG_FORMAT must be one of {', '.join(FORMATS)}")
    level = (level or os.environ.get("DUETIME_LOG_LEVEL") or "info").lower()
    if level not in LEVELS:
        raise ValueError(f"DUETIME_LOG_LEVEL must be one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # debug is duetime's own: the driver's debug events would drown it
    root.setLevel(max(logging.INFO, logging.getLevelName(level.upper())))
    logging.getLogger("duetime").setLevel(level.upper())
    # skipped runs of a still-running releaser step are by design (max_instances=1)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


def assign_request_id() -> None:
    """At a request's start: its id, the client's X-Request-Id when valid, else a new one."""
    given = request.headers.get("X-Request-Id", "")
    g.request_id = given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(8)


def log_request(response: Response, latency_s: float) -> None:
    """At a request's end: its `request` event (level by status, see above), and its id in the
    answer's X-Request-Id."""
    response.headers["X-Request-Id"] = g.request_id
    status = response.status_code
    level = logging.WARNING if status >= 500 else logging.INFO if status >= 400 else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    log.log(level, "request", extra={
        "method": request.method, "path": request.path, "status": status,
        "latency_ms": round(latency_s * 1000, 2)})
