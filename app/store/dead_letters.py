"""Messages made dead, newest first (schema/018_dashboard.cql, table dead_letters).

A row is written before the LWT that makes its message dead and never deleted, so the
table may name a message that is not dead (its LWT lost, or it was retried since): readers
check each message's state. Rows leave by TTL, a week after the message's own retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from app.core.timeparse import cql_ms
from app.store.session import CassandraSession, item_errors

MS_PER_WEEK = 7 * 86_400_000
_INSERT = ("INSERT INTO {ks}.dead_letters (topic_uid, week, dead_at, id) VALUES (?, ?, ?, ?) "
           "USING TTL ?")


def ttl_s(retention_days: int) -> int:
    """How long a dead-letter row lives: a week past the messages' retention."""
    return (retention_days + 7) * 86_400


class DeadLetterStore:
    def __init__(self, db: CassandraSession, retention_days: int) -> None:
        self.db = db
        self.ttl_s = ttl_s(retention_days)

    def note(self, topic_uid: uuid.UUID, dead: Sequence[tuple[str, int]]) -> list[Exception | None]:
        """Record (message id, dead at epoch ms) pairs; per pair None when written, else the
        exception. Pairs of one week go in one batch (one partition)."""
        by_week: dict[int, list[int]] = {}
        for index, (_, at) in enumerate(dead):
            by_week.setdefault(at // MS_PER_WEEK, []).append(index)
        chunks = list(by_week.values())
        outcomes = self.db.execute_batches(
            _INSERT, [[(topic_uid, dead[i][1] // MS_PER_WEEK, dead[i][1], dead[i][0],
                        self.ttl_s) for i in chunk] for chunk in chunks])
        return item_errors(chunks, outcomes, len(dead))

    def newest(self, topic_uid: uuid.UUID, now_ms: int, weeks: int) -> Iterator[tuple[str, int]]:
        """(message id, dead at epoch ms) pairs, newest first, of the last `weeks` weeks; the
        same id may come more than once (made dead, retried, dead again)."""
        for week in range(now_ms // MS_PER_WEEK, now_ms // MS_PER_WEEK - weeks, -1):
            for r in self.db.iterate(
                    "SELECT id, dead_at FROM {ks}.dead_letters WHERE topic_uid = ? AND week = ?",
                    (topic_uid, week), fetch_size=500):
                yield r["id"], cql_ms(r["dead_at"])
