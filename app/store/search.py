"""Finding a topic's messages by what they carry, through the storage-attached indexes
(SAI) on message_states (schema/026_search.cql).

A topic's rows lie in up to 2^20 home partitions, so a search is a range read over the
ring, restricted to the topic by the index on topic_uid and by the index of each filter
given; Cassandra intersects the indexes. Rows come in the ring's order: by the token of
their partition (topic_uid, home), then by id. Neither ever changes for a message, so a
search resumed strictly after the last (token, home, id) it read returns no message twice
and skips none that matches throughout, however the others change meanwhile.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from app.models import MessageFilter, MessageState
from app.store.messages import _SELECT, _row_to_state, _whole
from app.store.session import CassandraSession

# the token column of a search's rows, named so that dict rows find it
_SELECT_WITH_TOKEN = _SELECT.replace(
    "SELECT topic_uid, id,", "SELECT token(topic_uid, home) AS position, home, topic_uid, id,", 1)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a search stopped: the last row it read (its partition's token, home and id)."""

    token: int
    home: int
    id: str


@dataclasses.dataclass(frozen=True)
class Found:
    """Rows that matched, in ring order, and where the read stopped; `position` is None when
    nothing follows (the read came to the end of the ring)."""

    rows: list[MessageState]
    position: Position | None


def _conditions(flt: MessageFilter) -> tuple[list[str], list[Any]]:
    """CQL restrictions and their values for the filter's fields (each an indexed column)."""
    where: list[str] = []
    values: list[Any] = []
    for column, value in (("state", flt.state), ("campaign", flt.campaign),
                          ("recipient", flt.recipient)):
        if value is not None:
            where.append(f"{column} = ?")
            values.append(value)
    for key, value in flt.labels:
        where.append("labels[?] = ?")
        values.extend((key, value))
    if flt.due_from_ms is not None:
        where.append("deliver_at >= ?")
        values.append(flt.due_from_ms)
    if flt.due_to_ms is not None:
        where.append("deliver_at < ?")
        values.append(flt.due_to_ms)
    return where, values


class SearchStore:
    """Searches of message_states. Guarantees: rows in ring order (token of (topic_uid,
    home), then id); a search from a Position returns only rows after it; read at the
    session's consistency (a transition an LWT applied is seen)."""

    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def find(self, topic_uid: uuid.UUID, flt: MessageFilter, limit: int,
             after: Position | None = None) -> Found:
        """Up to `limit` matching rows after `after` (from the start when None). A filter
        that can match nothing (one label key with two values, due_to at or before
        due_from) reads nothing."""
        labels = dict(flt.labels)
        if len(labels) < len(set(flt.labels)) or (
                flt.due_from_ms is not None and flt.due_to_ms is not None
                and flt.due_to_ms <= flt.due_from_ms):
            return Found([], None)
        where, values = _conditions(dataclasses.replace(flt, labels=tuple(labels.items())))
        rows: list[dict[str, Any]] = []
        if after is not None:  # the rest of the partition the last search stopped in
            rows = self._read(["topic_uid = ?", "home = ?", "id > ?", *where],
                              [topic_uid, after.home, after.id, *values], limit)
        if len(rows) < limit:
            start = [] if after is None else ["token(topic_uid, home) > ?"]
            rows += self._read(["topic_uid = ?", *start, *where],
                               [topic_uid, *([] if after is None else [after.token]), *values],
                               limit - len(rows))
        last = rows[-1] if rows else None
        position = (None if last is None or len(rows) < limit
                    else Position(last["position"], last["home"], last["id"]))
        return Found([_row_to_state(r, topic_uid) for r in rows if _whole(r)], position)

    def _read(self, where: list[str], values: list[Any], limit: int) -> list[dict[str, Any]]:
        return self.db.execute(f"{_SELECT_WITH_TOKEN} WHERE {' AND '.join(where)} LIMIT ?",
                               [*values, limit])
