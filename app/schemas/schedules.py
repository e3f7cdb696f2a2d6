"""Recurring schedule schemas (openapi.yaml: schedules)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.ids import NAME
from app.schedules.cron import PATTERN
from app.schemas.fields import ZONE_FORMAT, Instant, Int, known_zone
from app.schemas.rules import exactly_one


class SchedulePutSchema(Schema):
    """A schedule. Each fire is an ordinary message with id `{name}:{fire time in epoch ms}`
    and deliver_at = the fire time (or the end of the topic's quiet hours, read in the
    schedule's timezone, when it falls inside them), produced 2 s ahead by the releaser that
    owns the schedule: exactly once however many releasers run. `cron` is a standard crontab
    (its `pattern` is the whole grammar: any string it admits is taken) of 5 fields, or 6
    with a leading seconds field, on the wall clock of `timezone`: a time in a DST gap fires
    the gap's length later, a time that exists twice fires at its first occurrence only.
    A schedule that has no fire within start_at and end_at (end_at at or before start_at,
    or already past; a day no month named, as `0 0 31 2 *`) is taken and never fires: its
    next_fire_times are empty. `misfire`: what happens to fires whose time passed while no
    releaser produced them (more than 1 s late): fire_once makes one late fire (the latest)
    for all of them, skip makes none. Replacing a schedule rewrites its fires produced and
    not yet handed out (cancels those that are no longer fires; 409 if that would change
    their campaign)."""

    JSON_RULES = exactly_one("payload", "payload_base64")

    cron = fields.String(required=True, metadata={
        "example": "0 9 * * MON-FRI", "format": "cron", "pattern": PATTERN,
        "description": "minute (0-59) hour (0-23) day of month (1-31) month (1-12 or JAN-DEC) "
                       "day of week (0-7 or SUN-SAT; 0 and 7 are Sunday), with an optional "
                       "leading seconds field (0-59), apart by spaces. Each field is a list "
                       "(`,`) of `*`, a value or a range `a-b`, each with an optional step "
                       "`/n` (1-99; `a/n` is a to the field's end); names in any case. A "
                       "range whose end comes before its start wraps around (hours `22-2`: "
                       "22, 23, 0, 1, 2). When both the day of month and the day of week "
                       "are restricted (neither starts with `*`), a day matching either "
                       "fires, as in Vixie cron."})
    timezone = fields.String(load_default="UTC", validate=known_zone,
                             metadata={"example": "Europe/Bucharest", "format": ZONE_FORMAT})
    payload = fields.Raw(allow_none=True, metadata={"description": "Any JSON value."})
    payload_base64 = fields.String(metadata={"format": "byte"})
    priority = Int(load_default=100, validate=validate.Range(0, 65535))
    campaign = fields.String(validate=validate.Regexp(NAME))
    start_at = Instant(epoch_ms_in=True, metadata={"description": "No fire before it."})
    end_at = Instant(epoch_ms_in=True, metadata={
        "example": "2027-06-30T17:00:00Z",
        "description": "No fire after it. At or before start_at (or past), the schedule is "
                       "taken and never fires."})
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
