"""Recurring schedule schemas (openapi.yaml: schedules)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.ids import NAME
from app.schemas.fields import ZONE_FORMAT, Instant, Int, known_zone
from app.schemas.rules import exactly_one


class SchedulePutSchema(Schema):
    """A schedule. Each fire is an ordinary message with id `{name}:{fire time in epoch ms}`
    and deliver_at = the fire time (or the end of the topic's quiet hours, read in the
    schedule's timezone, when it falls inside them), produced 2 s ahead by the releaser that
    owns the schedule: exactly once however many releasers run. `cron` is 5 fields, or 6
    with a leading seconds field, on the wall clock of `timezone`: a time in a DST gap fires
    the gap's length later, a time that exists twice fires at its first occurrence only.
    `misfire`: what happens to fires whose time passed while no releaser produced them
    (more than 1 s late): fire_once makes one late fire (the latest) for all of them, skip
    makes none. Replacing a schedule rewrites its fires produced and not yet handed out
    (cancels those that are no longer fires; 409 if that would change their campaign)."""

    JSON_RULES = exactly_one("payload", "payload_base64")

    cron = fields.String(required=True, metadata={"example": "0 9 * * MON-FRI",
                                                  "format": "cron"})
    timezone = fields.String(load_default="UTC", validate=known_zone,
                             metadata={"example": "Europe/Bucharest", "format": ZONE_FORMAT})
    payload = fields.Raw(allow_none=True, metadata={"description": "Any JSON value."})
    payload_base64 = fields.String(metadata={"format": "byte"})
    priority = Int(load_default=100, validate=validate.Range(0, 65535))
    campaign = fields.String(validate=validate.Regexp(NAME))
    start_at = Instant(epoch_ms_in=True, metadata={"description": "No fire before it."})
    end_at = Instant(epoch_ms_in=True, metadata={
        "example": "2027-06-30T17:00:00Z",
        "description": "No fire after it. Must be after start_at (else 400: a relation "
                       "between two fields that JSON Schema cannot state)."})
    misfire = fields.String(load_default="fire_once",
                            validate=validate.OneOf(["fire_once", "skip"]))

    @validates_schema
    def _one_payload(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("payload" in data) == ("payload_base64" in data):
            raise ValidationError("Give exactly one of payload or payload_base64.", "payload")


class ScheduleSchema(Schema):
    name = fields.String(required=True)
    cron = fields.String(required=True)
    timezone = fields.String(required=True)
    payload = fields.Raw(allow_none=True)
    payload_base64 = fields.String(metadata={"format": "byte"})
    priority = Int(required=True)
    campaign = fields.String(allow_none=True)
    start_at = Instant(allow_none=True)
    end_at = Instant(allow_none=True)
    misfire = fields.String(required=True)
    next_fire_times = fields.List(Instant(), required=True, metadata={
        "description": "The next 5 fires from now (fewer when end_at comes first)."})
    created_at = Instant(required=True)
    updated_at = Instant(required=True)


class ScheduleListSchema(Schema):
    schedules = fields.List(fields.Nested(ScheduleSchema), required=True)
