"""Campaign and operation schemas (openapi.yaml: campaigns, operations)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.timeline import MIN_PER_SECOND
from app.schemas.fields import Bool, Instant, Int, Number
from app.schemas.frequency_caps import CappedCountsSchema
from app.schemas.search import MessageFilterSchema
from app.schemas.topics import CountsSchema

MAX_SHIFT_MS = 365 * 86_400_000


class CampaignSchema(Schema):
    campaign = fields.String(required=True)
    counts = fields.Nested(CountsSchema, required=True, metadata={
        "description": "Messages per state, kept by every transition (counters: no scan)."})
    frequency_capped = fields.Nested(CappedCountsSchema, required=True, metadata={
        "description": "Its messages the topic's frequency_cap deferred or dropped."})
    first_deliver_at = Instant(allow_none=True, required=True, metadata={
        "description": "Earliest deliver_at of its messages (after shifts)."})
    last_deliver_at = Instant(allow_none=True, required=True, metadata={
        "description": "Latest deliver_at of its messages (after shifts)."})
    paused = fields.Boolean(required=True)
    max_per_second = fields.Float(allow_none=True, required=True)
    cancelled = fields.Boolean(required=True, metadata={
        "description": "Cancelled by DELETE: its messages are never delivered, and new "
                       "messages of it are refused (409)."})
    operation = fields.UUID(allow_none=True, required=True, metadata={
        "description": "The operation running on it (cancel, shift or resume), if any."})
    created_at = Instant(required=True)


class CampaignListSchema(Schema):
    campaigns = fields.List(fields.Nested(CampaignSchema), required=True)


class CampaignPatchSchema(Schema):
    """Either shift_ms (202, an operation), or paused and/or max_per_second (200)."""

    JSON_RULES = {"oneOf": [{"required": ["shift_ms"]},
                            {"anyOf": [{"required": ["paused"]},
                                       {"required": ["max_per_second"]}]}]}

    shift_ms = Int(validate=[
        validate.Range(-MAX_SHIFT_MS, MAX_SHIFT_MS),
        validate.NoneOf([0], error="Must not be 0.")], metadata={"not": {"enum": [0]},
        "description": "Move every scheduled (or paused) message by this many ms (negative: "
                       "earlier), "
                       "never to before now; one moved beyond the horizon waits parked and is "
                       "handed out at its time, as an enqueued one would. 400 if the "
                       "campaign's last message would pass the end of year 9999."})
    paused = Bool(metadata={
        "description": "true: its due messages are handed out neither to pull consumers nor "
                       "to webhooks (within 1 s on every process; a webhook message whose POST "
                       "has started still goes). false: "
                       "resume; what came due meanwhile goes out from then, earliest "
                       "deliver_at first, at the campaign's max_per_second if it has one "
                       "(delivery slots that passed while paused are drawn again)."})
    max_per_second = Number(allow_none=True, validate=validate.Range(
        min=MIN_PER_SECOND, max=1_000_000), metadata={
        "description": "Delivery pace of the campaign, messages a second (at least 0.001: one "
                       "every 1,000 s), or null for none."})

    @validates_schema
    def _one_kind(self, data: dict[str, Any], **kwargs: Any) -> None:
        controls = [f for f in ("paused", "max_per_second") if f in data]
        if "shift_ms" in data and controls:
            raise ValidationError("shift_ms goes alone, not with paused or max_per_second.",
                                  "shift_ms")
        if "shift_ms" not in data and not controls:
            raise ValidationError("Give shift_ms, or paused and/or max_per_second.",
                                  "shift_ms")


class OperationSchema(Schema):
    id = fields.UUID(required=True)
    kind = fields.String(required=True, validate=validate.OneOf(
        ["cancel", "shift", "pause", "resume"]), metadata={
        "description": "resume: started by un-pausing a campaign. pause: only through POST "
                       "/operations, done at once."})
    campaign = fields.String(required=True, allow_none=True, metadata={
        "description": "The campaign it acts on; null for an operation on a filter."})
    filter = fields.Nested(MessageFilterSchema, allow_none=True, metadata={
        "description": "The filter it acts on (POST /operations); null or absent for an "
                       "operation on a campaign."})
    state = fields.String(required=True,
                          validate=validate.OneOf(["running", "succeeded", "failed"]))
    processed = Int(required=True, metadata={
        "description": "Messages looked at so far: of the campaign, or matching the filter "
                       "when it reached them."})
    changed = Int(required=True, metadata={
        "description": "Messages this operation cancelled or moved."})
    delivering = Int(required=True, metadata={
        "description": "Cancel of a campaign: messages found being POSTed to the webhook, "
                       "which a cancel can no longer stop (counted as they end: delivered, "
                       "or cancelled if the POST fails). Cancel of a filter: messages found "
                       "handed out (leased to a pull consumer whose lease runs, or being "
                       "POSTed), left to their consumer's ack or nack."})
    shift_ms = Int(required=True)
    started_at = Instant(required=True)
    finished_at = Instant(allow_none=True)
    error = fields.String(allow_none=True)


class OperationAcceptedSchema(Schema):
    operation = fields.Nested(OperationSchema, required=True)
