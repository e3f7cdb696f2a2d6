"""Search: a topic's messages by state, campaign, recipient, labels and due time, page by
page (GET /v1/topics/{topic}/messages).

Order: the storage order of app.store.search, by the token of a message's home partition,
then by id: stable (neither changes for a message) but not by time. A page token names the
last row read (its place in that order, in plain text, as DynamoDB's ExclusiveStartKey);
the next page starts strictly after that row, so while messages change state between pages
none is shown twice and none that matches throughout is skipped. A message that starts or
stops matching between pages appears if the search reaches it while it matches. Every
string of TOKEN_PATTERN is a place: given with other filters or on another topic, a search
goes on from that place in the ring (follow each search with its own tokens).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from typing import Any

from app.errors import InvalidInput
from app.models import MessageFilter, MessageState, Topic
from app.services import Services
from app.store.search import Position, SearchStore

# a page token: where the previous page stopped, `{partition token}~{home}~{id}` in ring order;
# every string of this pattern is one (openapi.yaml gives it as page_token's pattern)
TOKEN_PATTERN = r"^-?[0-9]{1,19}~[0-9]{1,10}~[A-Za-z0-9_.:-]{1,128}$"
_TOKEN = re.compile(TOKEN_PATTERN)
_MIN_TOKEN, _MAX_TOKEN = -(2 ** 63), 2 ** 63 - 1
_MAX_HOME = 2 ** 31 - 1


def page_token(position: Position) -> str:
    return f"{position.token}~{position.home}~{position.id}"


def read_page_token(token: str) -> Position:
    """The position a page token names (a number past the ring's ends stands for its end);
    400 naming page_token when it is not of TOKEN_PATTERN."""
    if not _TOKEN.fullmatch(token):
        raise InvalidInput("page_token is not a page token.", {"page_token": [
            "Not a next_page_token: {partition token}~{home}~{id}."]})
    ring, home, last = token.split("~", 2)
    return Position(min(max(int(ring), _MIN_TOKEN), _MAX_TOKEN), min(int(home), _MAX_HOME), last)


# The cursors of filtered operations (workers/operations.py) stay bound to their topic and
# filter: kept in the operation's row, they are never a client's to make.
MAX_TOKEN_CHARS = 512


def fingerprint(topic_uid: uuid.UUID, flt: MessageFilter) -> str:
    """What a page token is bound to: this incarnation of the topic and this filter."""
    text = json.dumps([str(topic_uid), flt.state, flt.campaign, flt.recipient,
                       sorted(flt.labels), flt.due_from_ms, flt.due_to_ms])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_token(position: Position, bound: str) -> str:
    """A cursor bound to topic and filter (URL-safe base64 of JSON): a filtered
    operation's, kept in its row (workers/operations.py)."""
    raw = json.dumps([1, position.token, position.home, position.id, bound],
                     separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _bad_token(why: str) -> InvalidInput:
    return InvalidInput(f"page_token {why}.", {"page_token": [f"Not a page token of this "
                                                             f"search: {why}."]})


def decode_token(token: str, bound: str) -> Position:
    """The position a page token names; 400 naming page_token when it is not one this
    search (topic and filter) made."""
    if len(token) > MAX_TOKEN_CHARS:
        raise _bad_token("is too long")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        found = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise _bad_token("cannot be read") from exc
    if not (isinstance(found, list) and len(found) == 5 and found[0] == 1
            and all(isinstance(v, int) and not isinstance(v, bool) for v in found[1:3])
            and isinstance(found[3], str) and isinstance(found[4], str)):
        raise _bad_token("cannot be read")
    if not -(2 ** 63) <= found[1] < 2 ** 63 or not 0 <= found[2] < 2 ** 31:
        raise _bad_token("cannot be read")
    if found[4] != bound:
        raise _bad_token("was made for another topic or other filters")
    return Position(found[1], found[2], found[3])


def search(services: Services, topic: Topic, flt: MessageFilter, limit: int,
           token: str | None = None) -> tuple[list[MessageState], str | None]:
    """Up to `limit` matching messages of topic and the token of the next page (None when
    there is none). A page may hold fewer than `limit` while more follow."""
    after = None if token is None else read_page_token(token)
    found = SearchStore(services.db).find(topic.uid, flt, limit, after)
    rows = [r for r in found.rows if flt.matches(r)]
    return rows, None if found.position is None else page_token(found.position)


def parse_label(text: str) -> tuple[str, str]:
    """'key:value' -> (key, value): split at the first colon (a value may hold colons)."""
    key, sep, value = text.partition(":")
    if not sep:
        raise ValueError("must be key:value")
    return key, value


def filter_of(query: dict[str, Any]) -> MessageFilter:
    """The filter of a validated search query (app.schemas.search.SearchQuerySchema)."""
    return MessageFilter(
        state=query.get("state"), campaign=query.get("campaign"),
        recipient=query.get("recipient"),
        labels=tuple(parse_label(t) for t in query.get("label") or ()),
        due_from_ms=query.get("due_from"), due_to_ms=query.get("due_to"))
