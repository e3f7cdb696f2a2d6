"""Search schemas (openapi.yaml: GET /v1/topics/{topic}/messages)."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.ids import CLIENT_ID, NAME
from app.core.timeparse import RFC_3339
from app.messages.search import TOKEN_PATTERN
from app.models import STATES
from app.schemas.fields import Instant
from app.schemas.messages import MAX_LABEL_VALUE, MAX_LABELS, MessageSummarySchema

MAX_SEARCH_LIMIT = 1000
LABEL_FILTER = f"^[a-z0-9][a-z0-9_.-]{{0,63}}:.{{0,{MAX_LABEL_VALUE}}}$"


# epoch ms in a query string: digits, which a query cannot tell from an integer, so the
# document gives both forms the same values (the years 1653 to 5138)
_EPOCH_MS_DIGITS = "[0-9]{1,14}|-[0-9]{1,13}"
_EPOCH_MS = re.compile(f"^({_EPOCH_MS_DIGITS})$")


class QueryInstant(Instant):
    """A time in a query string: RFC 3339 with offset, or epoch milliseconds in digits."""

    def __init__(self, **kwargs: Any) -> None:
        metadata = kwargs.pop("metadata", {})
        metadata.update(type=["string", "integer"], minimum=-(10 ** 13 - 1),
                        maximum=10 ** 14 - 1,
                        pattern=f"^({_EPOCH_MS_DIGITS}|{RFC_3339.pattern})$")
        super().__init__(metadata=metadata, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, str) and _EPOCH_MS.match(value):
            value = int(value)
        return super()._deserialize(value, attr, data, **kwargs)


def _label_problem(text: str) -> str | None:
    key, sep, value = text.partition(":")
    if not sep or not NAME.match(key):
        return f"{text[:80]!r} is not key:value with a key of the name pattern."
    if len(value) > MAX_LABEL_VALUE:
        return f"The value of {key!r} is over {MAX_LABEL_VALUE} characters."
    return None


class MessageFilterSchema(Schema):
    """Which messages of a topic: every filter optional, those given ANDed. The one
    validation of a search's query (SearchQuerySchema) and of a filtered operation's
    `filter` (a JSON object: times also as epoch ms integers)."""

    state = fields.String(validate=validate.OneOf(STATES))
    campaign = fields.String(validate=validate.Regexp(NAME))
    recipient = fields.String(validate=validate.Regexp(CLIENT_ID))
    label = fields.List(fields.String(metadata={"pattern": LABEL_FILTER}),
                        validate=validate.Length(max=MAX_LABELS), metadata={
        "description": "key:value (split at the first colon); several labels are each "
                       "required (at most 10; a key given twice with two values matches "
                       "nothing)."})
    due_from = Instant(epoch_ms_in=True, metadata={
        "description": "Only messages whose deliver_at is at or after this."})
    due_to = Instant(epoch_ms_in=True, metadata={
        "example": "2026-12-02T09:00:00.250Z",  # after due_from's: the example is accepted
        "description": "Only messages whose deliver_at is before this (at or before "
                       "due_from: none)."})

    @validates_schema
    def _labels(self, data: dict[str, Any], **kwargs: Any) -> None:
        """A label key named twice is taken (both values required: nothing matches when
        they differ) and so is a due_to at or before due_from (nothing matches): a filter
        that matches nothing is a search answered empty, an operation that changes none."""
        problems = [p for p in map(_label_problem, data.get("label") or []) if p]
        if problems:
            raise ValidationError(problems, "label")


class SearchQuerySchema(MessageFilterSchema):
    """The filters of MessageFilterSchema as query parameters (label repeated), and paging."""

    label = fields.List(fields.String(metadata={"pattern": LABEL_FILTER}),
                        validate=validate.Length(max=MAX_LABELS), metadata={
        "description": "key:value (split at the first colon); repeat it for several labels, "
                       "each required (at most 10; a key given twice with two values "
                       "matches nothing)."})
    due_from = QueryInstant(metadata={
        "description": "Only messages whose deliver_at is at or after this."})
    due_to = QueryInstant(metadata={
        "example": "2026-12-02T09:00:00.250Z",
        "description": "Only messages whose deliver_at is before this (at or before "
                       "due_from: none)."})
    limit = fields.Integer(load_default=100, validate=validate.Range(1, MAX_SEARCH_LIMIT),
                           metadata={"description": "At most this many a page (1-1000, "
                                                    "default 100)."})
    page_token = fields.String(metadata={
        "pattern": TOKEN_PATTERN,
        "description": "next_page_token of the previous page, with the same filters: where "
                       "that page stopped in storage order, in plain text. Any string of "
                       "the pattern is a place to go on from; with other filters, or on "
                       "another topic, a search goes on from that place (follow each "
                       "search with its own tokens)."})


class SearchPageSchema(Schema):
    messages = fields.List(fields.Nested(MessageSummarySchema), required=True, metadata={
        "description": "The matching messages of this page, without payloads (GET one for "
                       "its payload), in storage order: by a hash of the message's home "
                       "partition, then by id. The order is the same for every page of a "
                       "search but is not time order."})
    next_page_token = fields.String(required=True, allow_none=True, metadata={
        "description": "Give it as page_token for the next page; null when this is the "
                       "last. A page may hold fewer than `limit` messages while more follow. "
                       "Paging never shows a message twice and never skips one that matches "
                       "throughout, however messages change meanwhile."})
