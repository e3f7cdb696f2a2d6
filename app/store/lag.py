"""Delivery lag per topic and minute (schema/018_dashboard.cql, table lag_minutes).

Each writer (one process) upserts its totals of a minute, per lag bucket, under its own
writer id: rewriting them is idempotent, and a reader adds up the writers of each minute.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from cassandra.cluster import ResponseFuture

from app.core.timeline import MS_PER_HOUR
from app.store.session import CassandraSession

# upper edges of the lag buckets in ms; a last bucket counts what is beyond the last edge
LAG_EDGES_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)
BUCKETS = len(LAG_EDGES_MS) + 1


@dataclasses.dataclass
class LagMinute:
    """A minute's lags: how many fell in each bucket (counts[i] ≤ LAG_EDGES_MS[i], the last
    beyond them), and the largest seen (ms)."""

    counts: list[int] = dataclasses.field(default_factory=lambda: [0] * BUCKETS)
    max_ms: int = 0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def percentile_ms(self, q: float) -> int | None:
        """An upper bound of the q-quantile (0 < q ≤ 1) of the lags, in ms: the upper edge of
        the bucket it falls in, never above the largest lag seen; None when there is none."""
        total = self.count
        if not total:
            return None
        reached = 0
        for index, n in enumerate(self.counts):
            reached += n
            if reached >= q * total:
                edge = LAG_EDGES_MS[index] if index < len(LAG_EDGES_MS) else self.max_ms
                return min(edge, self.max_ms)
        return self.max_ms

    def add(self, other: LagMinute) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.max_ms = max(self.max_ms, other.max_ms)


class LagStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def write(self, topic_uid: uuid.UUID, minute_ms: int, writer: uuid.UUID,
              lags: LagMinute) -> ResponseFuture:
        """Upsert this writer's totals of the minute (epoch ms of its start)."""
        return self.db.execute_async(
            "INSERT INTO {ks}.lag_minutes (topic_uid, hour, minute, writer, counts, max_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (topic_uid, minute_ms // MS_PER_HOUR, minute_ms, writer, lags.counts, lags.max_ms))

    def read(self, topic_uid: uuid.UUID, first_ms: int, last_ms: int) -> dict[int, LagMinute]:
        """Every writer's totals added up, per minute start (epoch ms) in [first_ms, last_ms]."""
        hours: Sequence[int] = range(first_ms // MS_PER_HOUR, last_ms // MS_PER_HOUR + 1)
        futures = [self.db.execute_async(
            "SELECT minute, counts, max_ms FROM {ks}.lag_minutes WHERE topic_uid = ? "
            "AND hour = ? AND minute >= ? AND minute <= ?", (topic_uid, h, first_ms, last_ms))
            for h in hours]
        minutes: dict[int, LagMinute] = {}
        for rows in self.db.results(futures):
            for r in rows:
                counts = list(r["counts"] or [])
                if len(counts) != BUCKETS:
                    continue  # written with other buckets: not comparable
                minutes.setdefault(r["minute"], LagMinute()).add(
                    LagMinute(counts, r["max_ms"] or 0))
        return minutes
