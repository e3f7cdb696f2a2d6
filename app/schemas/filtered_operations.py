"""The body of POST /v1/topics/{topic}/operations: an operation on the messages a filter
matches (openapi.yaml)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas.campaigns import MAX_SHIFT_MS
from app.schemas.fields import Int
from app.schemas.search import MessageFilterSchema


class OperationRequestSchema(Schema):
    """shift_ms with kind shift, and only then."""

    JSON_RULES = {"oneOf": [
        {"properties": {"kind": {"const": "shift"}}, "required": ["shift_ms"]},
        {"properties": {"kind": {"enum": ["cancel", "pause", "resume"]}},
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
            "its send window places it (a paused one stays paused at its new time; one moved "
            "beyond the horizon waits parked); one that would pass the end of year 9999 "
            "stays. pause: every matching message waiting to be "
            "handed out becomes `paused` and is not handed out until resumed (one handed out "
            "and not finished is counted as `delivering`). resume: every matching paused "
            "message is scheduled again at its due time, or now if that has passed (inside its "
            "send window; in a campaign with max_per_second, a delivery slot that passed "
            "while paused is drawn again, so the campaign keeps its pace). "
            "These run in the background and resume where they were if the process running "
            "them dies; each message is changed at most once. Messages enqueued while one "
            "runs may or may not be reached. A pause or resume whose filter is {campaign} "
            "alone pauses or resumes that campaign instead, as PATCH of the campaign does: "
            "its messages, later ones too, are held back by the campaign's flag (the "
            "operation has succeeded at once), and a resume brings back what came due "
            "meanwhile; messages paused by a filter are resumed by a filter too (e.g. "
            "{campaign, state: paused})."})
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
