"""Custom fields: instants on the wire are RFC 3339 (or epoch ms on input), epoch ms inside."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields

from app.timeparse import TimeFormatError, format_ms, parse_instant, zone

ZONE_FORMAT = "iana-time-zone"  # the format of a field naming a zone, e.g. Europe/Bucharest


def known_zone(value: str) -> None:
    """A marshmallow validator: an IANA time zone this machine knows (tzdata)."""
    try:
        zone(value)
    except TimeFormatError as exc:
        raise ValidationError(str(exc)) from exc


class Instant(fields.Field):
    """RFC 3339 with offset, or integer epoch milliseconds, in; RFC 3339 UTC (ms) out."""

    def __init__(self, **kwargs: Any) -> None:
        metadata = kwargs.pop("metadata", {})
        metadata.setdefault("type", "string")
        metadata.setdefault("format", "date-time")
        metadata.setdefault("example", "2026-12-01T09:00:00.250Z")
        super().__init__(metadata=metadata, **kwargs)

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> Any:
        return None if value is None else format_ms(int(value))

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        try:
            return parse_instant(value)
        except TimeFormatError as exc:
            raise ValidationError(str(exc)) from exc
