"""Custom fields: instants on the wire are RFC 3339 (or epoch ms on input), epoch ms inside."""

from __future__ import annotations

from importlib import resources
from typing import Any

from marshmallow import ValidationError, fields

from app.core.timeparse import (
    MAX_MS,
    MIN_MS,
    RFC_3339,
    TimeFormatError,
    format_ms,
    parse_instant,
    zone,
)

ZONE_FORMAT = "iana-time-zone"  # the format of a field naming a zone, e.g. Europe/Bucharest
# The zones a field of ZONE_FORMAT takes: the list of the tzdata package (a dependency), the
# same on every machine, which openapi.yaml gives as the TimeZone enum (app.api.openapi_file);
# not the system's zoneinfo, which adds names of its own (localtime).
ZONES: tuple[str, ...] = tuple(sorted(
    resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()))
_ZONE_SET = frozenset(ZONES)


def known_zone(value: str) -> None:
    """A marshmallow validator: an IANA time zone of ZONES (tzdata's list, the document's
    TimeZone enum) that loads."""
    try:
        if value not in _ZONE_SET:
            raise TimeFormatError(f"unknown IANA time zone: {value!r}")
        zone(value)
    except TimeFormatError as exc:
        raise ValidationError(str(exc)) from exc


class Int(fields.Integer):
    """A JSON integer: an int, or a number with no fraction (1.0, as JSON Schema counts it).
    Refuses a string, a bool and a fractional number (which fields.Integer would truncate)."""

    def _validated(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        if isinstance(value, float) and not value.is_integer():
            raise self.make_error("invalid")
        return int(value)


class Number(fields.Float):
    """A JSON number: an int or a float, not a string (fields.Float would read " 5 " and
    "1_000") nor a bool."""

    def _validated(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        return super()._validated(value)


class Bool(fields.Boolean):
    """A JSON boolean: true or false only (fields.Boolean would take 0, 1, "yes", ...)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class Instant(fields.Field):
    """RFC 3339 with offset, or integer epoch milliseconds, in; RFC 3339 UTC (ms) out."""

    def __init__(self, *, epoch_ms_in: bool = False, **kwargs: Any) -> None:
        """epoch_ms_in: an input field, documented as taking epoch ms (an integer) too."""
        metadata = kwargs.pop("metadata", {})
        metadata.setdefault("type", ["string", "integer"] if epoch_ms_in else "string")
        # JSON Schema applies the pattern to a string, the range to a number
        metadata.setdefault("pattern", f"^{RFC_3339.pattern}$")
        if epoch_ms_in:
            metadata.setdefault("minimum", MIN_MS)
            metadata.setdefault("maximum", MAX_MS)
        metadata.setdefault("format", "date-time")
        metadata.setdefault("example", "2026-12-01T09:00:00.250Z")
        super().__init__(metadata=metadata, **kwargs)

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> Any:
        return None if value is None else format_ms(int(value))

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, float) and value.is_integer():  # an integer, as JSON Schema counts
            value = int(value)
        try:
            return parse_instant(value)
        except TimeFormatError as exc:
            raise ValidationError(str(exc)) from exc
