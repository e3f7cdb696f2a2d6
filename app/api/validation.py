"""Path parameters: names and message ids, documented with their patterns (the `name` and
`message_id` URL converters) and checked in full, answered as 400 problems naming the field."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask_smorest import Api
from werkzeug.routing import UnicodeConverter

from app.core.ids import CLIENT_ID, NAME
from app.errors import InvalidInput


def check_name(field: str, value: str) -> None:
    if not NAME.fullmatch(value):
        raise InvalidInput(f"Invalid {field} name.", {field: [f"Must match {NAME.pattern}."]})


def check_message_id(value: str) -> None:
    if not CLIENT_ID.fullmatch(value):
        raise InvalidInput("Invalid message id.", {"id": [f"Must match {CLIENT_ID.pattern}."]})


class NameConverter(UnicodeConverter):
    """A topic, campaign or schedule name in a path: routed like any string (so a bad one
    is answered 400 by check_name, not 404 by the router), documented with NAME."""


class MessageIdConverter(UnicodeConverter):
    """A message id in a path: routed like any string, documented with CLIENT_ID."""


def _pattern_of(regex: str) -> Any:
    return lambda _converter: {"type": "string", "pattern": regex}


def register(app: Flask, api: Api) -> None:
    """Add the converters to the app's routing and their patterns to the spec; before any
    blueprint is registered."""
    app.url_map.converters["name"] = NameConverter
    app.url_map.converters["message_id"] = MessageIdConverter
    api.register_converter(NameConverter, _pattern_of(NAME.pattern))
    api.register_converter(MessageIdConverter, _pattern_of(CLIENT_ID.pattern))
