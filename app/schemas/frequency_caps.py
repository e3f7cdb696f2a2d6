"""Frequency cap schemas (openapi.yaml: a topic's `frequency_cap`, the counts of capped
messages in /stats and a campaign's view)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.frequency_cap import MAX_HOURS, MAX_PER_WINDOW, ON_CAP, PERS, CapError, FrequencyCap
from app.schemas.fields import Int

CAP_RULES = (
    "At most `max` messages handed out per recipient per local calendar day (per: day; "
    "the recipient's zone: the message's timezone, else the topic's, else UTC; a day starts "
    "at local midnight, or at the first instant after it when midnight falls in a DST gap) "
    "or per rolling window of `hours` after each hand-out (per: hours). Handed out means a "
    "consumer's lease call was answered with it, or its webhook POST started: the moment of "
    "the producer's contract. Exact across every API process and releaser: never max + 1 "
    "in one recipient's window. A message without `recipient`, or with frequency_cap: "
    "false, is neither held back nor counted. A nack, a failed POST, or a message taken for "
    "a call that had gone gives its slot back (nobody was notified); an expired lease does "
    "not (the consumer may have sent it), and the message taken again after it counts "
    "once. A message past the cap at its hand-out is, with on_cap defer, moved to the "
    "recipient's next allowed moment (when the day or the oldest hand-out's window ends), "
    "then to its send window's next opening; its deliver_at shows where, "
    "requested_deliver_at the time asked, and its attempt is not counted. With on_cap "
    "drop it is cancelled, cancel_reason frequency_capped. A cancel or move before the "
    "hand-out still wins. A changed max applies at once: after it is lowered, hand-outs "
    "made before still count until their windows end, so none goes until fewer than the "
    "new max count.")


class FrequencyCapSchema(Schema):
    """A topic's frequency cap (CAP_RULES)."""

    JSON_RULES = {"anyOf": [
        {"properties": {"per": {"const": "day"}}, "not": {"required": ["hours"]}},
        {"properties": {"per": {"const": "hours"}}, "required": ["hours"]}]}

    max = Int(required=True, validate=validate.Range(1, MAX_PER_WINDOW), metadata={
        "description": "Messages handed out per recipient per window.", "example": 2})
    per = fields.String(required=True, validate=validate.OneOf(PERS), metadata={
        "description": "day: the recipient's local calendar day; hours: a rolling window "
                       "of `hours` after each hand-out."})
    hours = Int(validate=validate.Range(1, MAX_HOURS), metadata={
        "description": "The rolling window's length in hours (only with per: hours)."})
    on_cap = fields.String(required=True, validate=validate.OneOf(ON_CAP), metadata={
        "description": "defer: move it to the next allowed moment; drop: cancel it."})

    @validates_schema
    def _a_cap(self, data: dict[str, Any], **kwargs: Any) -> None:
        try:
            FrequencyCap.parse(data["max"], data["per"], data.get("hours"), data["on_cap"])
        except CapError as exc:
            raise ValidationError(exc.message, exc.field) from exc
        except KeyError:
            return  # a missing field is reported by its own required check


class CappedCountsSchema(Schema):
    """How often the topic's frequency cap held messages back (counted since the topic was
    made, like the state counts, and as approximate)."""

    deferred = Int(required=True, metadata={
        "description": "Deferrals (a message deferred twice counts twice)."})
    dropped = Int(required=True, metadata={
        "description": "Messages cancelled with cancel_reason frequency_capped."})


def stored_cap(given: dict[str, Any] | None) -> str | None:
    """The stored form of a validated frequency_cap (None: none)."""
    if given is None:
        return None
    return FrequencyCap.parse(given["max"], given["per"], given.get("hours"),
                              given["on_cap"]).text()


def shown_cap(stored: str | None) -> dict[str, object] | None:
    """A stored cap as the API shows it."""
    return None if stored is None else FrequencyCap.from_text(stored).api()

