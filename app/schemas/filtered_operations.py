"""The body of POST /v1/topics/{topic}/operations: an operation on the messages a filter
matches (openapi.yaml)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas.campaigns import MAX_SHIFT_MS
from app.schemas.fields import Int
from app.schemas.search import MessageFilterSchema


class OperationRequestSchema(Schema):
    """shift_ms with kind shift, and only then; pause and resume take a filter of a campaign
    alone."""

    JSON_RULES = {"oneOf": [
        {"properties": {"kind": {"const": "shift"}}, "required": ["shift_ms"]},
        {"properties": {"kind": {"const": "cancel"}}, "not": {"required": ["shift_ms"]}},
        {"properties": {"kind": {"enum": ["pause", "resume"]},
                        "filter": {"required": ["campaign"], "maxProperties": 1}},
         "not": {"required": ["shift_ms"]}}]}

    kind = fields.String(required=True, validate=validate.OneOf(
        ["cancel", "shift", "pause", "resume"]), metadata={
        "example": "cancel",
        "description":
            "cancel: every matching message waiting to be handed out is cancelled and never "
            "handed out; one already handed out and not finished (leased to a pull consumer "
            "whose lease runs, or being POSTed) is counted as `delivering` and left to its "
            "consumer (its nack puts it back, not cancelled). shift: every matching scheduled "
            "message moves by shift_ms from the time it asked for, never to before now, then "
            "its send window places it; one that would pass the horizon stays. Both run in "
            "the background and resume where they were if the process running them dies; "
            "each message is changed at most once. Messages enqueued while one runs may or "
            "may not be reached. pause / resume: the filter must be {campaign} alone (else "
            "400): the campaign is paused (its messages are not handed out until resumed; "
            "the operation has succeeded at once) or resumed (what came due meanwhile is "
            "brought back by the operation), as PATCH of the campaign does."})
    filter = fields.Nested(MessageFilterSchema, required=True, metadata={
        "description": "Which messages: the search's filters (GET /v1/topics/{topic}/"
                       "messages) as an object, ANDed; times RFC 3339 or epoch ms; {} is "
                       "every message of the topic. Each is checked when the operation "
                       "reaches the message: one that no longer matches then is left alone."})
    shift_ms = Int(validate=[
        validate.Range(-MAX_SHIFT_MS, MAX_SHIFT_MS),
        validate.NoneOf([0], error="Must not be 0.")], metadata={
        "not": {"enum": [0]},
        "description": "kind shift only: ms to move each message by (negative: earlier)."})

    @validates_schema
    def _shift_with_shift(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("kind") == "shift" and "shift_ms" not in data:
            raise ValidationError("A shift needs shift_ms.", "shift_ms")
        if data.get("kind") not in (None, "shift") and "shift_ms" in data:
            raise ValidationError("Only a shift takes shift_ms.", "shift_ms")
