"""Counters behind /stats: messages per state, and scheduled messages per minute and per hour
ahead.

Guarantee: a counter moves once per *applied* transition (the caller knows from the LWT
result). Counter writes are not idempotent, so they are never retried; a counter write that
times out may leave a count off by one, which is why these feed dashboards, not decisions.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.timeline import MS_PER_DAY, MS_PER_HOUR, MS_PER_MINUTE
from app.store.session import CassandraSession

_STATE = "UPDATE {ks}.state_counts SET n = n + ? WHERE topic_uid = ? AND state = ?"
_UPCOMING = ("UPDATE {ks}.upcoming_counts SET n = n + ? "
             "WHERE topic_uid = ? AND day = ? AND minute = ?")
_UPCOMING_HOUR = ("UPDATE {ks}.upcoming_hours SET n = n + ? "
                  "WHERE topic_uid = ? AND week = ? AND hour = ?")
HOURS_PER_WEEK = 168


@dataclasses.dataclass(frozen=True)
class _SlotTable:
    """A counter table of time slots (minutes or hours), per_partition slots a partition."""

    select: str
    per_partition: int


_MINUTES = _SlotTable("SELECT minute AS slot, n FROM {ks}.upcoming_counts WHERE topic_uid = ? "
                      "AND day = ? AND minute >= ? AND minute <= ?", MS_PER_DAY // MS_PER_MINUTE)
_HOURS = _SlotTable("SELECT hour AS slot, n FROM {ks}.upcoming_hours WHERE topic_uid = ? "
                    "AND week = ? AND hour >= ? AND hour <= ?", HOURS_PER_WEEK)


class CountStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def add_states(self, topic_uid: uuid.UUID, deltas: dict[str, int]) -> None:
        """Apply per-state deltas, e.g. {"scheduled": -1, "leased": +1}."""
        self.db.results(self.db.counter_batches(self.state_updates(topic_uid, deltas)))

    @staticmethod
    def state_updates(topic_uid: uuid.UUID,
                      deltas: Mapping[str, int]) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_states, to send with others
        (CassandraSession.counter_batches)."""
        return [(_STATE, (d, topic_uid, s)) for s, d in deltas.items() if d]

    def add_upcoming(self, topic_uid: uuid.UUID, due_ms: Iterable[int], sign: int = 1) -> None:
        """Count (sign=+1) or uncount (-1) scheduled messages at these due times, per minute."""
        self.db.results(self.db.counter_batches(
            self.upcoming_updates_at(topic_uid, due_ms, sign)))

    def add_upcoming_per_minute(self, topic_uid: uuid.UUID, per_minute: Mapping[int, int],
                                sign: int = 1) -> None:
        """Count scheduled messages given as {epoch minute: how many}, per minute and per hour
        (the two always move together)."""
        updates = self.upcoming_updates(topic_uid, per_minute, sign)
        self.db.results(self.db.counter_batches(updates))

    @classmethod
    def upcoming_updates_at(cls, topic_uid: uuid.UUID, due_ms: Iterable[int],
                            sign: int = 1) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_upcoming, to send with others."""
        return cls.upcoming_updates(topic_uid, Counter(ms // MS_PER_MINUTE for ms in due_ms),
                                    sign)

    @staticmethod
    def upcoming_updates(topic_uid: uuid.UUID, per_minute: Mapping[int, int],
                         sign: int = 1) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_upcoming_per_minute, to send with others."""
        per_hour: Counter[int] = Counter()
        for minute, n in per_minute.items():
            per_hour[minute // 60] += n
        return [(_UPCOMING, (sign * n, topic_uid, minute * MS_PER_MINUTE // MS_PER_DAY, minute))
                for minute, n in per_minute.items()] + [
            (_UPCOMING_HOUR, (sign * n, topic_uid, hour // HOURS_PER_WEEK, hour))
            for hour, n in per_hour.items()]

    def states(self, topic_uid: uuid.UUID) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT state, n FROM {ks}.state_counts WHERE topic_uid = ?", (topic_uid,))
        return {r["state"]: r["n"] for r in rows}

    def upcoming(self, topic_uid: uuid.UUID, from_ms: int, to_ms: int) -> dict[int, int]:
        """Scheduled messages per minute (epoch minute → count) in [from_ms, to_ms)."""
        return self._slots(_MINUTES, topic_uid, from_ms // MS_PER_MINUTE,
                           (to_ms - 1) // MS_PER_MINUTE)

    def upcoming_hours(self, topic_uid: uuid.UUID, from_ms: int, to_ms: int) -> dict[int, int]:
        """Scheduled messages per hour (epoch hour → count) in [from_ms, to_ms)."""
        return self._slots(_HOURS, topic_uid, from_ms // MS_PER_HOUR, (to_ms - 1) // MS_PER_HOUR)

    def _slots(self, table: _SlotTable, topic_uid: uuid.UUID, first: int, last: int
               ) -> dict[int, int]:
        """Counts of slots first..last (inclusive) of a slot counter table, one read per
        partition they span."""
        futures = [self.db.execute_async(table.select, (topic_uid, part, first, last))
                   for part in range(first // table.per_partition,
                                     last // table.per_partition + 1)]
        return {r["slot"]: r["n"] for rows in self.db.results(futures) for r in rows if r["n"]}

