"""Topic schemas (openapi.yaml: topics)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas.fields import ZONE_FORMAT, Instant, Int, Number, known_zone
from app.schemas.frequency_caps import CAP_RULES, CappedCountsSchema, FrequencyCapSchema
from app.schemas.rules import at_most_one
from app.schemas.windows import WINDOW_RULES, QuietHoursSchema, SendWindowSchema


class RetrySchema(Schema):
    """The delay after the n-th failed attempt: backoff_seconds x 2^(n-1), at most
    max_backoff_seconds (which caps the first delay too), with equal jitter on webhooks."""

    backoff_seconds = Number(load_default=None, validate=validate.Range(0.001, 86_400))
    max_backoff_seconds = Number(load_default=None, validate=validate.Range(0.001, 86_400))


# the URLs the url field accepts, as a JSON Schema pattern: http(s), a host name ending in a
# name of letters (or a bare one such as localhost) or an IPv4 address, a port, a path and a
# query (the server's own check, fields.Url, also takes forms this leaves out, e.g. IPv6)
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
HTTP_URL = (r"^[hH][tT][tT][pP][sS]?://(([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
            r"[A-Za-z]{2,63}|" + _OCTET + r"(\." + _OCTET + r"){3})(:" + _PORT + r")?"
            r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)*(\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]+)?$")


def sendable_url(url: str) -> None:
    """What fields.Url takes but a POST could not carry as written (the schema's pattern
    leaves them out too): a port outside 1 to 65535, a user or password, a fragment."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # past 65535, or not a number
        port = 0
    if port == 0:
        raise ValidationError("The port must be from 1 to 65535.")
    if parts.username is not None or parts.password is not None:
        raise ValidationError("A user or password in the URL is not sent: give credentials "
                              "in a message header (Authorization).")
    if parts.fragment or url.endswith("#"):
        raise ValidationError("A fragment (#...) never reaches the server: leave it out.")


class DeliverySchema(Schema):
    """mode webhook comes with its url (also when only the mode of a topic changes)."""

    JSON_RULES = {"anyOf": [
        {"not": {"required": ["mode"], "properties": {"mode": {"const": "webhook"}}}},
        {"required": ["url"], "properties": {"url": {"type": "string"}}}]}
    mode = fields.String(load_default=None, validate=validate.OneOf(["pull", "webhook"]))
    url = fields.Url(load_default=None, schemes={"http", "https"}, require_tld=False,
                     validate=sendable_url, metadata={"format": "http-url", "pattern": HTTP_URL})
    timeout_seconds = Number(load_default=None, validate=validate.Range(0.1, 120))

    @validates_schema
    def _webhook_has_url(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("mode") == "webhook" and data.get("url") is None:
            raise ValidationError("Required for mode webhook.", "url")


class TopicPutSchema(Schema):
    """All optional. On create, omitted fields take the defaults shown; on update, omitted
    fields keep their current values. Changing `shards` of a topic with scheduled, paused or
    leased messages answers 409. send_window and quiet_hours together answer 400."""

    JSON_RULES = at_most_one("send_window", "quiet_hours")

    lease_seconds = Int(load_default=None,
                                   validate=validate.Range(1, 43_200),
                                   metadata={"description": "Default lease, s (default 30)."})
    max_attempts = Int(load_default=None, validate=validate.Range(1, 1000),
                                  metadata={"description": "Then dead (default 10)."})
    retry = fields.Nested(RetrySchema, load_default=None,
                          metadata={"description": "Backoff after nack/failure, s (1 and 600)."})
    shards = Int(load_default=None, validate=validate.Range(1, 256),
                            metadata={"description": "Releaser parallelism (default 16)."})
    delivery = fields.Nested(DeliverySchema, load_default=None, metadata={"description": (
        "pull (default: consumers take leases) or webhook with url: at each message's "
        "deliver_at (never before) a releaser POSTs the payload to url (application/json, or "
        "application/octet-stream for payload_base64), signed as Standard Webhooks are: "
        "webhook-id (the message id, the same on every attempt), webhook-timestamp (Unix "
        "seconds) and webhook-signature (v1,<base64 HMAC-SHA256 of "
        "'{webhook-id}.{webhook-timestamp}.{body}'> for each active signing secret, "
        "space-separated; receivers refuse timestamps outside their tolerance, so a captured "
        "POST cannot be replayed later). Also Duetime-Message-Id, Duetime-Topic, "
        "Duetime-Attempt, Duetime-Deliver-At (RFC 3339), and the deprecated "
        "Duetime-Signature (lowercase hex HMAC-SHA256 of the body alone under the current "
        "secret's key; it can be replayed, and goes in a later minor version). "
        "2xx within timeout_seconds = delivered; anything else is retried after the retry "
        "backoff (exponential, equal jitter), dead after max_attempts with last_error kept.")})
    timezone = fields.String(load_default=None, validate=known_zone, metadata={
        "example": "America/New_York", "format": ZONE_FORMAT,
        "description": "The IANA zone of the topic's messages that name no `timezone` of "
                       "their own (default UTC): the recipient's wall clock for them."})
    quiet_hours = fields.Nested(QuietHoursSchema, allow_none=True, metadata={
        "description": "The older spelling of send_window: quiet hours [start, end) daily "
                       "are the send window [end, start) every day, applied wherever a "
                       "send window is, read in the message's timezone, else this "
                       "timezone. Setting them removes the send_window; null removes them. "
                       "Not together with send_window (400)."})
    send_window = fields.Nested(SendWindowSchema, allow_none=True, metadata={
        "description": WINDOW_RULES + " Setting it removes quiet hours; null removes it. A "
                       "message's own send_window replaces it; a message with send_window "
                       "(or quiet_hours) false is exempt."})

    frequency_cap = fields.Nested(FrequencyCapSchema, allow_none=True, metadata={
        "description": CAP_RULES + " null removes it."})

    @validates_schema
    def _one_window(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "send_window" in data and "quiet_hours" in data:
            raise ValidationError("Give send_window or quiet_hours, not both.", "send_window")


class TopicSchema(Schema):
    name = fields.String(required=True)
    lease_seconds = Int(required=True)
    max_attempts = Int(required=True)
    retry = fields.Nested(RetrySchema, required=True)
    shards = Int(required=True)
    delivery = fields.Nested(DeliverySchema, required=True)
    signing_secret = fields.String(required=True, metadata={"description": (
        "The webhook signing secret: whsec_ + base64 of the HMAC-SHA256 key (Standard "
        "Webhooks), as the reference libraries take it.")})
    previous_signing_secret_expires_at = Instant(allow_none=True, required=True, metadata={
        "description": "Until when the secret a rotation replaced signs too; null when none."})
    quiet_hours = fields.Nested(QuietHoursSchema, allow_none=True, required=True, metadata={
        "description": "As set (null when a send_window or nothing is)."})
    send_window = fields.Nested(SendWindowSchema, allow_none=True, required=True, metadata={
        "description": "As set (null when quiet hours or nothing are)."})
    timezone = fields.String(required=True, metadata={
        "format": ZONE_FORMAT, "description": "Zone of messages that name none (UTC unless set)."})
    frequency_cap = fields.Nested(FrequencyCapSchema, allow_none=True, required=True, metadata={
        "description": "As set (null: none)."})
    created_at = Instant(required=True)
    updated_at = Instant(required=True)


class RotateSecretSchema(Schema):
    overlap_seconds = Int(
        load_default=86_400, validate=validate.Range(0, 2_592_000), metadata={
            "description": "How long the replaced secret signs beside the new one, s "
                           "(default a day, at most 30 days; 0: it stops at once)."})


class TopicListSchema(Schema):
    topics = fields.List(fields.Nested(TopicSchema), required=True)


class CountsSchema(Schema):
    scheduled = Int(required=True)
    paused = Int(required=True, metadata={
        "description": "Held back by a filtered pause (POST /operations) until resumed."})
    leased = Int(required=True)
    delivered = Int(required=True)
    cancelled = Int(required=True)
    dead = Int(required=True)


class WindowSchema(Schema):
    from_ = Instant(required=True, data_key="from")
    to = Instant(required=True)
    count = Int(required=True)


class StatsQuerySchema(Schema):
    window = fields.String(load_default="minute", validate=validate.OneOf(["minute", "hour"]),
                           metadata={"description": "minute: the next hour per minute; hour: "
                                     "the next 7 days per hour."})


class TopicStatsSchema(Schema):
    counts = fields.Nested(CountsSchema, required=True)
    frequency_capped = fields.Nested(CappedCountsSchema, required=True)
    upcoming = fields.List(fields.Nested(WindowSchema), required=True, metadata={
        "description": "Messages due per window ahead (see `window`): 60 minutes from the "
                       "current one, or 168 hours from the current one. A window counts what "
                       "is due in it, handed out or not: the current one includes those "
                       "already handed out since it began (a cancel or a move uncounts)."})


class LagQuerySchema(Schema):
    minutes = fields.Integer(load_default=60, validate=validate.Range(min=1, max=120),
                             metadata={"description": "How many minutes back, the current "
                                                      "one included (1-120)."})


class LagWindowSchema(Schema):
    from_ = Instant(required=True, data_key="from")
    to = Instant(required=True)
    count = Int(required=True, metadata={
        "description": "Messages handed out in this minute (leased to a pull consumer, or "
                       "their POST started)."})
    p50_ms = Int(required=True, allow_none=True, metadata={
        "description": "Median lag, ms: the upper edge of its bucket (1, 2, 5, 10, 25, 50, "
                       "100, 250, 500 ms, 1, 2.5, 5, 10, 30, 60 s), at most max_ms; null "
                       "when count is 0."})
    p99_ms = Int(required=True, allow_none=True,
                            metadata={"description": "99th percentile lag, ms, as p50_ms."})
    max_ms = Int(required=True, allow_none=True,
                            metadata={"description": "Largest lag, ms; null when count is 0."})


class LagSchema(Schema):
    minutes = fields.List(fields.Nested(LagWindowSchema), required=True, metadata={
        "description": "One entry a minute, oldest first. Each API process and releaser "
                       "writes its figures every 5 s, so the last seconds may be missing."})
