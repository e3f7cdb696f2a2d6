"""Message and lease schemas (openapi.yaml: messages, leases, acks)."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.ids import CLIENT_ID, NAME
from app.core.timeline import MAX_HORIZON_DAYS, MS_PER_DAY
from app.core.timeparse import LOCAL_TIME
from app.messages.headers import (
    NAME_PATTERN,
    RESERVED_PATTERN,
    VALUE_PATTERN,
    header_problems,
)
from app.models import STATES
from app.schemas.fields import ZONE_FORMAT, Bool, Instant, Int, known_zone
from app.schemas.rules import at_most_one, exactly_one, needs
from app.schemas.windows import WindowOrFalse

_TIME_FIELDS = ("deliver_at", "delay_ms", "local_time")


_DELIVER_AT = ("RFC 3339 with offset, or epoch ms. A time past is due now; any later time "
               "is kept (one past the server's horizon, DUETIME_HORIZON_DAYS, waits parked "
               "and is handed out at its time, never before).")


def _delay_ms() -> Int:
    """A delay from now (ms), at most MAX_HORIZON_DAYS (deliver_at takes any later time)."""
    return Int(validate=validate.Range(0, MAX_HORIZON_DAYS * MS_PER_DAY), metadata={
        "description": f"ms from now, at most {MAX_HORIZON_DAYS} days (deliver_at takes any "
                       "later time)."})


IF_EXISTS = ("reject", "replace", "keep")


MAX_LABELS = 10
MAX_LABEL_VALUE = 64
LABELS_JSON = {"maxProperties": MAX_LABELS, "propertyNames": {"pattern": NAME.pattern},
               "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE}}


def labels_field(**kwargs: Any) -> fields.Dict:
    """A message's labels: at most 10 key: value pairs, keys names (the topic name pattern),
    values up to 64 characters."""
    return fields.Dict(keys=fields.String(validate=validate.Regexp(NAME)),
                       values=fields.String(validate=validate.Length(max=MAX_LABEL_VALUE)),
                       validate=validate.Length(max=MAX_LABELS), **kwargs)


class MessageInSchema(Schema):
    """One message. Give at most one of deliver_at, delay_ms or local_time (+ timezone); none
    means due now. Give payload (any JSON) or payload_base64 (binary). local_time is a wall
    time without offset in `timezone`: a time in a DST gap moves forward by the gap's length,
    a time in a DST fold takes its first occurrence. `timezone` alone (with another time or
    none) names the recipient's zone for the send window. Give at most one of send_window
    and quiet_hours (both: 400)."""

    JSON_RULES = {"allOf": [at_most_one(*_TIME_FIELDS), needs("local_time", "timezone"),
                            at_most_one("send_window", "quiet_hours"),
                            needs("if_exists", "id"), exactly_one("payload", "payload_base64")],
                  "properties": {"headers": {
                      "maxProperties": 32,
                      "propertyNames": {"minLength": 1, "maxLength": 128,
                                        "pattern": NAME_PATTERN,
                                        "not": {"pattern": RESERVED_PATTERN}},
                      "additionalProperties": {"pattern": VALUE_PATTERN}},
                      "labels": LABELS_JSON}}

    id = fields.String(validate=validate.Regexp(CLIENT_ID), metadata={
        "description": "Client id (idempotency key); generated (time-ordered) if absent."})
    deliver_at = Instant(epoch_ms_in=True, metadata={"description": _DELIVER_AT})
    delay_ms = _delay_ms()
    local_time = fields.String(metadata={"example": "2026-12-01T09:00:00",
                                         "format": "date-time-local",
                                         "pattern": f"^{LOCAL_TIME.pattern}$"})
    timezone = fields.String(validate=known_zone, metadata={
        "example": "Europe/Bucharest", "format": ZONE_FORMAT,
        "description": "The recipient's IANA zone; when absent, the topic's `timezone` "
                       "(UTC unless set) is the message's zone."})
    quiet_hours = Bool(metadata={
        "description": "false: the topic's send window (or quiet hours) does not apply, as "
                       "send_window: false (the older spelling). true: as if not given."})
    send_window = WindowOrFalse()
    frequency_cap = Bool(metadata={
        "description": "false: the topic's frequency_cap neither holds this message back nor "
                       "counts it (a transactional send). true: as if not given."})
    payload = fields.Raw(allow_none=True, metadata={
        "description": "Any JSON value, nested at most 64 levels deep (deeper: 400)."})
    payload_base64 = fields.String(metadata={"format": "byte"})
    priority = Int(load_default=100, validate=validate.Range(0, 65535),
                              metadata={"description": "Lower is handed out first."})
    campaign = fields.String(validate=validate.Regexp(NAME))
    recipient = fields.String(validate=validate.Regexp(CLIENT_ID), metadata={
        "description": "Who the message is for (the id pattern): found again with "
                       "GET /messages?recipient=."})
    labels = labels_field(metadata={
        "description": "At most 10 key: value pairs (keys: the name pattern; values: up to "
                       "64 characters), found again with GET /messages?label=key:value. "
                       "Kept by moves and shown by GET and leases; replaced as a whole by "
                       "if_exists replace."})
    group = fields.String(validate=validate.Regexp(NAME), metadata={
        "description": "Fair-delivery group (default: the campaign). When due messages pile "
                       "up, each lease pass hands them out round-robin across groups within "
                       "a priority: one of every group, then the next of every group. Groups "
                       "share a timeline lane (and so their turns) only when their hashes "
                       "collide, 1 in 1,023 for two groups. Webhook topics take the same "
                       "turns for their POST slots."})
    headers = fields.Dict(keys=fields.String(validate=validate.Length(1, 128)),
                          values=fields.String(validate=validate.Length(max=1024)),
                          validate=validate.Length(max=32), metadata={
        "description": "Sent with the webhook POST. Names are RFC 9110 tokens, values "
                       "tabs and printable Latin-1 (no control character, nothing past "
                       "U+00FF); names duetime sets or HTTP/1.1 framing owns (content-type, "
                       "content-length, host, transfer-encoding, connection, expect, te, "
                       "trailer, upgrade, keep-alive, webhook-*, duetime-*, in any case) are "
                       "refused."})
    if_exists = fields.String(validate=validate.OneOf(IF_EXISTS), metadata={
        "description": "What a repeated `id` does (only with an id). reject (default): the "
                       "same content answers 200 (a retry), other content 409. replace: "
                       "while the message is scheduled (or paused: it stays so), its time, "
                       "payload, headers, "
                       "priority, campaign and group become these (one conditional write: "
                       "it is handed out with either the old or the new content and time, "
                       "never a mix, never before the time it carries); 200 with the "
                       "message, 409 once it is leased or finished. keep: 200 with the "
                       "message as it is, whatever the content (the first one wins). An id "
                       "repeated inside one batch is answered as its first occurrence (409 "
                       "for other content, except with keep)."})

    @validates_schema
    def _allowed_headers(self, data: dict[str, Any], **kwargs: Any) -> None:
        problems = header_problems(data.get("headers") or {})
        if problems:
            raise ValidationError(problems, "headers")

    @validates_schema
    def _one_time_one_payload(self, data: dict[str, Any], **kwargs: Any) -> None:
        given = [f for f in _TIME_FIELDS if f in data]
        if len(given) > 1:
            raise ValidationError(f"Give at most one of {', '.join(_TIME_FIELDS)}.", given[1])
        if "local_time" in data and "timezone" not in data:
            raise ValidationError("local_time needs a timezone.", "timezone")
        if "if_exists" in data and "id" not in data:
            raise ValidationError("if_exists needs an id.", "if_exists")
        if "send_window" in data and "quiet_hours" in data:
            raise ValidationError("Give send_window or quiet_hours, not both.", "send_window")
        if ("payload" in data) == ("payload_base64" in data):
            raise ValidationError("Give exactly one of payload or payload_base64.", "payload")


class EnqueuedSchema(Schema):
    id = fields.String(required=True)
    deliver_at = Instant(required=True)
    state = fields.String(required=True)


class BatchInSchema(Schema):
    messages = fields.List(fields.Dict(), required=True, validate=validate.Length(min=1),
                           metadata={"description": "Messages as in the single enqueue "
                                     "(validated one by one)."})


class BatchItemSchema(Schema):
    id = fields.String(allow_none=True)
    status = Int(required=True, metadata={
        "description": "201 created; 200 already there with the same content, replaced "
                       "(if_exists replace) or kept (if_exists keep); 409 id taken by other "
                       "content, or a replace of a message no longer scheduled; 400/413 "
                       "invalid; 503 retry later."})
    deliver_at = Instant()
    state = fields.String()
    error = fields.Dict(metadata={"description": "problem+json body of a failed item."})


class BatchOutSchema(Schema):
    results = fields.List(fields.Nested(BatchItemSchema), required=True)


class MessageSummarySchema(Schema):
    """A message without its payload (search pages)."""

    id = fields.String(required=True)
    topic = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(STATES))
    deliver_at = Instant(required=True)
    priority = Int(required=True)
    campaign = fields.String(allow_none=True)
    group = fields.String(allow_none=True)
    recipient = fields.String(allow_none=True)
    labels = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "Its labels ({} when none)."})
    timezone = fields.String(allow_none=True, metadata={
        "description": "Its own zone as given (null: none given, so the topic's applies)."})
    attempts = Int(required=True)
    created_at = Instant(required=True)
    updated_at = Instant(required=True)
    last_error = fields.String(allow_none=True)
    cancel_reason = fields.String(allow_none=True, metadata={
        "description": "Why duetime cancelled it: frequency_capped when the topic's "
                       "frequency_cap (on_cap: drop) dropped it; null otherwise."})
    frequency_cap_exempt = fields.Boolean(required=True, metadata={
        "description": "true when it was enqueued with frequency_cap: false."})
    requested_deliver_at = Instant(metadata={
        "description": "The delivery time asked for, present only when the send window (or "
                       "quiet hours) moved the message: deliver_at is then the window's "
                       "opening it was placed at. A move (PATCH, campaign shift) sets both "
                       "anew; a retry's backoff changes neither."})


class MessageSchema(MessageSummarySchema):
    """A message with its payload."""

    payload = fields.Raw(allow_none=True)
    payload_base64 = fields.String(metadata={"description": "Instead of payload, for binary.",
                                             "format": "byte"})
    headers = fields.Dict(keys=fields.String(), values=fields.String())


class DeadQuerySchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=500),
                           metadata={"description": "At most this many (1-500)."})


class DeadListSchema(Schema):
    messages = fields.List(fields.Nested(MessageSchema), required=True, metadata={
        "description": "Dead messages, the most recently dead first, from the topic's "
                       "retention window (DUETIME_RETENTION_DAYS); each has its last_error."})


class RescheduleSchema(Schema):
    """Give deliver_at or delay_ms (from now)."""

    JSON_RULES = exactly_one("deliver_at", "delay_ms")
    deliver_at = Instant(epoch_ms_in=True, metadata={"description": _DELIVER_AT})
    delay_ms = _delay_ms()

    @validates_schema
    def _exactly_one(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("deliver_at" in data) == ("delay_ms" in data):
            raise ValidationError("Give exactly one of deliver_at or delay_ms.", "deliver_at")


class LeaseRequestSchema(Schema):
    max = Int(load_default=10, validate=validate.Range(1, 1000))
    wait_ms = Int(load_default=0, validate=validate.Range(0, 30_000))
    lease_seconds = Int(validate=validate.Range(1, 43_200), metadata={
        "description": "Default: the topic's lease_seconds."})
    consumer = fields.String(validate=validate.Length(max=128))


class LeaseSchema(Schema):
    token = fields.String(required=True, metadata={
        "description": "Opaque. Present it to ack, nack and extend; extend answers with the "
                       "same token (it is the same lease)."})
    expires_at = Instant(required=True)


class LeasedMessageSchema(Schema):
    id = fields.String(required=True)
    payload = fields.Raw(allow_none=True)
    payload_base64 = fields.String(metadata={"format": "byte"})
    headers = fields.Dict(keys=fields.String(), values=fields.String())
    deliver_at = Instant(required=True)
    priority = Int(required=True)
    campaign = fields.String(allow_none=True)
    group = fields.String(allow_none=True)
    recipient = fields.String(allow_none=True)
    labels = fields.Dict(keys=fields.String(), values=fields.String(),
                         metadata={"description": "Its labels ({} when none)."})
    attempt = Int(required=True)
    lease = fields.Nested(LeaseSchema, required=True)


class LeaseResponseSchema(Schema):
    messages = fields.List(fields.Nested(LeasedMessageSchema), required=True)


# a lease token as leases hand it out (app.delivery.leasing.token_of): the lease's uuid, then
# optionally its version and expiry (epoch ms), then optionally the campaign
LEASE_TOKEN = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"(\.[0-9]{1,19}\.[0-9]{1,19}(\.([a-z0-9][a-z0-9_.-]{0,63})?)?)?$")


def _lease_token() -> fields.String:
    return fields.String(required=True, validate=validate.Regexp(
        LEASE_TOKEN, error="Not a lease token."))


class AckSchema(Schema):
    lease_token = _lease_token()


class AckItemSchema(Schema):
    id = fields.String(required=True, validate=validate.Regexp(CLIENT_ID))
    lease_token = fields.String(required=True)


class AckBatchSchema(Schema):
    acks = fields.List(fields.Nested(AckItemSchema), required=True,
                       validate=validate.Length(1, 1000),
                       metadata={"description": "Up to 1,000 (id, lease_token) pairs."})


class AckResultSchema(Schema):
    id = fields.String(required=True)
    status = Int(required=True, metadata={
        "description": "204 delivered (or already acked with this token), 400 malformed "
                       "token, 404 no such message, 409 lease no longer held, 503 retry."})
    error = fields.Dict(metadata={"description": "problem+json body of a failed item."})


class AckBatchResultSchema(Schema):
    results = fields.List(fields.Nested(AckResultSchema), required=True)


class NackSchema(Schema):
    lease_token = _lease_token()
    delay_ms = Int(validate=validate.Range(0, MAX_HORIZON_DAYS * MS_PER_DAY))
    error = fields.String(validate=validate.Length(max=2000))


class ExtendSchema(Schema):
    lease_token = _lease_token()
    lease_seconds = Int(required=True, validate=validate.Range(1, 43_200))


class ExtendResponseSchema(Schema):
    lease = fields.Nested(LeaseSchema, required=True)
