"""Counters behind /stats: messages per state, and scheduled messages per minute and per hour
ahead; and the ledger that writes every counter of the process.

Guarantee: a counter moves once per *applied* transition (the caller knows from the LWT
result), by way of the process's CounterLedger: it sums the moves of every request and writes
them every FLUSH_S, so a one-message request writes no counter of its own. A count is
therefore up to FLUSH_S (plus a write) behind in other processes; a read of counts in this
process writes this process's moves first. Counter writes are not idempotent, so a flush that
may have applied is never retried, and a process killed loses the moves it had not written:
a count can be off by those, which is why counts feed dashboards, not decisions.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cassandra import Unavailable
from cassandra.cluster import NoHostAvailable

from app.core.timeline import MS_PER_DAY, MS_PER_HOUR, MS_PER_MINUTE
from app.errors import StoreUnavailable
from app.store.session import CassandraSession

FLUSH_S = 0.2  # how long a counter move waits in its process before it is written
REFUSED_RETRY_S = 2.0  # after a flush the node refused, before the next try
CounterUpdate = tuple[str, Sequence[Any]]  # (CQL adding its first parameter, parameters)
log = logging.getLogger("duetime.counts")
_LEDGERS: weakref.WeakSet[CounterLedger] = weakref.WeakSet()


class CounterLedger:
    """The counter moves of one session, summed per counter until they are written: by a
    thread FLUSH_S after the first unwritten move, by flush(), or at close(). Thread-safe.
    A flush refused before it applied (no node available) keeps its moves for the next one;
    one that may have applied (a timeout) is not sent again."""

    def __init__(self, db: CassandraSession, flush_s: float = FLUSH_S) -> None:
        self.db = db
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one write of the moves at a time, so none is lost
        self._moves: Counter[tuple[str, tuple[Any, ...]]] = Counter()
        self._pending = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        _LEDGERS.add(self)

    def add(self, updates: Iterable[CounterUpdate]) -> None:
        """Count these updates (each (cql, (delta, *key))) toward their next write."""
        with self._lock:
            for cql, params in updates:
                if params[0]:
                    self._moves[(cql, tuple(params[1:]))] += params[0]
            if not self._moves:
                return
            self._pending.set()
            if self._thread is None or not self._thread.is_alive():  # also after a fork
                self._thread = threading.Thread(target=self._run, name="counter-ledger",
                                                daemon=True)
                self._thread.start()

    def flush(self) -> bool:
        """Write every move counted so far (waits for the writes; a failure is logged).
        False when some were refused before they applied and are kept for the next flush."""
        with self._flushing:
            with self._lock:
                moves, self._moves = self._moves, Counter()
                self._pending.clear()
            updates = [(cql, (n, *key)) for (cql, key), n in moves.items() if n]
            sent: list[tuple[list[Any], Any]] = []
            refused: list[tuple[list[Any], Exception]] = []
            try:
                groups = self.db.counter_groups(updates)  # prepares: a node down refuses
            except StoreUnavailable as exc:
                groups, refused = [], [(updates, exc)]
            for chunk in groups:
                try:
                    sent.append((chunk, self.db.counter_batch(chunk)))
                except StoreUnavailable as exc:  # not sent
                    refused.append((chunk, exc))
            for chunk, future in sent:
                try:
                    future.result()
                except (Unavailable, NoHostAvailable) as exc:  # refused before it applied
                    refused.append((chunk, exc))
                except Exception as exc:  # may have applied: counters are never sent twice
                    log.warning("counters not written (counts may be off): %r", exc)
            for chunk, why in refused:
                log.warning("counters not written, kept for the next flush: %r", why)
                self.add(chunk)
        return not refused

    def close(self) -> None:
        """Stop the thread and write what is left."""
        _LEDGERS.discard(self)
        self._closed.set()
        self._pending.set()
        if self._thread is not None:
            self._thread.join(timeout=self.flush_s + 10)
        self.flush()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._pending.wait()
            if self._closed.wait(self.flush_s):
                return
            try:
                if not self.flush():  # the node refused: not again for a while
                    self._closed.wait(REFUSED_RETRY_S)
            except Exception as exc:  # never let the thread die
                log.warning("counter flush failed: %r", exc)


def flush_counters() -> None:
    """Write the counter moves of every ledger of this process, so a read of counts that
    follows sees every move this process made."""
    for ledger in list(_LEDGERS):
        ledger.flush()


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
    """The stats counters: moves go through the process's ledger (CounterLedger), reads
    write this process's moves first."""

    def __init__(self, db: CassandraSession) -> None:
        self.db = db
        self.ledger = CounterLedger(db)

    def add(self, updates: Iterable[CounterUpdate]) -> None:
        """Count counter updates of any table (their first parameter the delta) toward the
        ledger's next write."""
        self.ledger.add(updates)

    def add_states(self, topic_uid: uuid.UUID, deltas: dict[str, int]) -> None:
        """Apply per-state deltas, e.g. {"scheduled": -1, "leased": +1}."""
        self.ledger.add(self.state_updates(topic_uid, deltas))

    @staticmethod
    def state_updates(topic_uid: uuid.UUID,
                      deltas: Mapping[str, int]) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_states, to add with others."""
        return [(_STATE, (d, topic_uid, s)) for s, d in deltas.items() if d]

    def add_upcoming(self, topic_uid: uuid.UUID, due_ms: Iterable[int], sign: int = 1) -> None:
        """Count (sign=+1) or uncount (-1) scheduled messages at these due times, per minute."""
        self.ledger.add(self.upcoming_updates_at(topic_uid, due_ms, sign))

    def add_upcoming_per_minute(self, topic_uid: uuid.UUID, per_minute: Mapping[int, int],
                                sign: int = 1) -> None:
        """Count scheduled messages given as {epoch minute: how many}, per minute and per hour
        (the two always move together)."""
        self.ledger.add(self.upcoming_updates(topic_uid, per_minute, sign))

    def flush(self) -> None:
        """Write the moves counted so far (CounterLedger.flush)."""
        self.ledger.flush()

    def close(self) -> None:
        self.ledger.close()

    @classmethod
    def upcoming_updates_at(cls, topic_uid: uuid.UUID, due_ms: Iterable[int],
                            sign: int = 1) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_upcoming, to add with others."""
        return cls.upcoming_updates(topic_uid, Counter(ms // MS_PER_MINUTE for ms in due_ms),
                                    sign)

    @staticmethod
    def upcoming_updates(topic_uid: uuid.UUID, per_minute: Mapping[int, int],
                         sign: int = 1) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_upcoming_per_minute, to add with others."""
        per_hour: Counter[int] = Counter()
        for minute, n in per_minute.items():
            per_hour[minute // 60] += n
        return [(_UPCOMING, (sign * n, topic_uid, minute * MS_PER_MINUTE // MS_PER_DAY, minute))
                for minute, n in per_minute.items()] + [
            (_UPCOMING_HOUR, (sign * n, topic_uid, hour // HOURS_PER_WEEK, hour))
            for hour, n in per_hour.items()]

    def states(self, topic_uid: uuid.UUID) -> dict[str, int]:
        """Messages per state (read after this process's moves are written)."""
        flush_counters()
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
        partition they span (read after this process's moves are written)."""
        flush_counters()
        futures = [self.db.execute_async(table.select, (topic_uid, part, first, last))
                   for part in range(first // table.per_partition,
                                     last // table.per_partition + 1)]
        return {r["slot"]: r["n"] for rows in self.db.results(futures) for r in rows if r["n"]}

