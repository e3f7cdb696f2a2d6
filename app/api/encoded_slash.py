"""Paths whose names or ids hold an encoded `/` (%2F): answered 400 instead of routed.

The server decodes %2F into `/` before routing, so a name or id holding one (which no name
or id may: app.core.ids) would otherwise reach another route, such as `/stats` for the topic
`t/stats`. The path as sent is RAW_URI (gunicorn, werkzeug) or REQUEST_URI."""

from __future__ import annotations

from flask import Flask, request

from app.errors import InvalidInput


def _refuse_encoded_slash() -> None:
    sent = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or ""
    if "%2f" in sent.partition("?")[0].lower():
        raise InvalidInput("A name or id in the path holds '/' (%2F), which none may.",
                           {"path": ["Must not hold an encoded '/' (%2F)."]})


def register(app: Flask) -> None:
    app.before_request(_refuse_encoded_slash)
