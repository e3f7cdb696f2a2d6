"""The one place a request's JSON body is read: the blueprints' argument parser.

A body of another (or no) Content-Type is 415. Besides what the JSON grammar refuses (400),
it refuses what JSON parses but duetime cannot carry, as a 400 naming where it sits: NaN
and Infinity (and a number too large for a float, which would read as one), an integer of
more than the interpreter's 4,300 digits, and a string or name holding a lone UTF-16
surrogate ("\\ud800": it cannot be encoded as UTF-8, which every stored text is)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import flask
import flask_smorest
import marshmallow as ma
from webargs import core
from webargs.flaskparser import FlaskParser

from app.errors import InvalidInput, UnsupportedMediaType

# a \u escape of a UTF-16 surrogate; only then can a parsed string hold a lone one (raw
# UTF-8 bytes cannot encode a surrogate: they fail to decode, 400 already)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _Refused(ValueError):
    """A number JSON spells but duetime refuses; parsing stops at the first."""


class _Bad:
    """Stands in the parsed value for what was refused, so its place can be named."""

    def __init__(self, why: str) -> None:
        self.why = why


def _refuse_constant(name: str) -> Any:
    raise _Refused(name)


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _Refused(text)
    return number


def _marked_constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a number JSON carries.")


def _marked_float(text: str) -> float | _Bad:
    number = float(text)
    return number if math.isfinite(number) else _Bad("Out of range for a number.")


def _marked_int(text: str) -> int | _Bad:
    try:
        return int(text)
    except ValueError:  # over sys.get_int_max_str_digits() (4,300)
        return _Bad("An integer of too many digits.")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _where_refused(value: Any) -> dict[str, Any]:
    """The errors of a value parsed with the _marked_* hooks, nested as marshmallow nests
    them ({"messages": {"0": {"priority": [msg]}}}); without recursion."""
    errors: dict[str, Any] = {}
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        why = None
        if isinstance(item, _Bad):
            why = item.why
        elif isinstance(item, str) and _has_surrogate(item):
            why = "A lone UTF-16 surrogate, which is not text."
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    _put(errors, (*path, "(name)"), "A name with a lone UTF-16 surrogate.")
                    continue
                stack.append((child, (*path, key)))
        elif isinstance(item, list):
            stack.extend((child, (*path, str(i))) for i, child in enumerate(item))
        if why is not None:
            _put(errors, path or ("json",), why)
    return errors


def _put(errors: dict[str, Any], path: tuple[str, ...], message: str) -> None:
    node = errors
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node.setdefault(path[-1], [message])


def loads(text: str) -> Any:
    """A request body's JSON text → its value; 400 InvalidInput naming each refused place,
    json.JSONDecodeError for text that is not JSON."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except json.JSONDecodeError:
        raise
    except (_Refused, ValueError):
        value = None
    else:
        if not _SURROGATE_ESCAPE.search(text) or not _where_refused(value):
            return value
    marked = json.loads(text, parse_constant=_marked_constant, parse_float=_marked_float,
                        parse_int=_marked_int)
    raise InvalidInput("The body holds a value JSON cannot carry here.",
                       _where_refused(marked) or {"json": ["A value that cannot be read."]})


class JsonBodyParser(FlaskParser):
    """webargs' parser, reading JSON bodies with loads and answering 415 for a body that
    is not declared JSON. An empty body stays missing (the schema's defaults and required
    fields apply), as before."""

    def _raw_load_json(self, req: flask.Request) -> Any:
        data = req.get_data(cache=True)
        if not core.is_json(req.mimetype):
            if not data:
                return core.missing
            raise UnsupportedMediaType(
                "The body must be JSON: send it with Content-Type: application/json.",
                {"Content-Type": ["Must be application/json."]})
        return loads(data.decode("utf-8")) if isinstance(data, bytes) else loads(data)


class Blueprint(flask_smorest.Blueprint):
    """flask-smorest's Blueprint, with JsonBodyParser; each JSON body it reads documents its
    415, and invalid arguments are documented as the 400 they answer (not webargs' 422)."""

    ARGUMENTS_PARSER = JsonBodyParser()

    def arguments(self, schema: type[ma.Schema] | ma.Schema | str, *, location: str = "json",
                  **kwargs: Any) -> Any:
        kwargs.setdefault("error_status_code", 400)
        parse = super().arguments(schema, location=location, **kwargs)
        if location != "json":
            return parse
        documented = self.alt_response(415, "UNSUPPORTED_MEDIA_TYPE")
        return lambda func: documented(parse(func))
