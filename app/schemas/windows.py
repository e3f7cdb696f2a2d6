"""Send window schemas (openapi.yaml: a topic's and a message's `send_window`, quiet hours)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.send_window import DAYS, HH_MM, SendWindow, WindowError
from app.schemas.fields import ZONE_FORMAT, known_zone

WINDOW_RULES = ("Days and hours in which a message may be due, on the wall clock of the "
                "recipient's zone: the message's `timezone`, else the topic's, else UTC. It "
                "opens at `start` on each of `days` and closes at `end`, the end itself "
                "outside; an end at or before the start crosses midnight, `days` naming the "
                "day it opens (FRI 22:00-06:00 holds Saturday 05:59); an end equal to the "
                "start keeps it open 24 hours. A message whose due time falls outside is "
                "placed at the next opening (its deliver_at shows where, "
                "requested_deliver_at the time asked for), wherever a due time is set: "
                "enqueue, batch, Spark import, a schedule's fire, PATCH, a campaign shift, "
                "and a retry's backoff (nack, failed webhook POST: the next attempt waits for "
                "the opening). Never earlier than asked. A wall time in a DST gap moves "
                "forward by the gap's length; one that occurs twice takes its first "
                "occurrence.")


def _hh_mm(example: str) -> fields.String:
    return fields.String(required=True, validate=validate.Regexp(HH_MM, error="Must be HH:MM."),
                         metadata={"example": example, "pattern": HH_MM.pattern})


class SendWindowSchema(Schema):
    """A send window (WINDOW_RULES)."""

    days = fields.List(fields.String(validate=validate.OneOf(DAYS)), required=True,
                       validate=validate.Length(1, 7),
                       metadata={"uniqueItems": True, "example": ["MON", "TUE", "WED", "THU",
                                                                  "FRI"]})
    start = _hh_mm("09:00")
    end = _hh_mm("20:00")

    @validates_schema
    def _a_window(self, data: dict[str, Any], **kwargs: Any) -> None:
        try:
            SendWindow.parse(data["days"], data["start"], data["end"])
        except WindowError as exc:
            raise ValidationError(exc.message, exc.field) from exc


class QuietHoursSchema(Schema):
    """Quiet hours, the older spelling of a send window: a daily window [start, end) in which
    no message of the topic is due (the send window [end, start) every day); one that would
    be is placed at `end`. It wraps midnight when end <= start; start == end holds nothing.
    The wall clock is the message's own `timezone` when it has one, else this `timezone`."""

    start = _hh_mm("21:00")
    end = _hh_mm("08:00")
    timezone = fields.String(load_default="UTC", validate=known_zone,
                             metadata={"example": "Europe/Bucharest", "format": ZONE_FORMAT})


_WINDOW_JSON = {
    "type": "object", "required": ["days", "start", "end"], "additionalProperties": False,
    "properties": {
        "days": {"type": "array", "items": {"type": "string", "enum": list(DAYS)},
                 "minItems": 1, "maxItems": 7, "uniqueItems": True},
        "start": {"type": "string", "pattern": HH_MM.pattern, "example": "09:00"},
        "end": {"type": "string", "pattern": HH_MM.pattern, "example": "20:00"}}}


class WindowOrFalse(fields.Field):
    """A message's own send window ({days, start, end}), or false: none applies to it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(metadata={
            "oneOf": [_WINDOW_JSON, {"type": "boolean", "enum": [False]}],
            "description": "The message's own send window, instead of the topic's; false: "
                           "no window applies (a transactional send). " + WINDOW_RULES},
            **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if value is False:
            return False
        if not isinstance(value, dict):
            raise ValidationError("A send window {days, start, end}, or false.")
        return SendWindowSchema().load(value)
