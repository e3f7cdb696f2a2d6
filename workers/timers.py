"""The releaser's in-memory timer heap: due entries read ahead, handed out at their due time.

Never early: pop_due returns an entry only once the clock reads at or after its due time.
Among entries due together, lower priority values come first.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
import uuid

from app.scan import Due, PointerKey
from app.services import Clock

MAX_WAIT_S = 0.05


@dataclasses.dataclass(frozen=True)
class Timer:
    """One pointer waiting for its moment, with the topic and release slot it belongs to."""

    topic_uid: uuid.UUID
    slot: int
    due: Due

    @property
    def key(self) -> PointerKey:
        return (self.topic_uid, self.due.pointer.id, self.due.pointer.version)


class DueTimers:
    """Thread-safe. Holds each pointer key once, from add() until done()."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[int, int, int, Timer]] = []
        self._held: dict[PointerKey, Timer] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def add(self, timers: list[Timer]) -> int:
        """Schedule timers not already held; returns how many were new."""
        added = 0
        with self._cond:
            for t in timers:
                if t.key not in self._held:
                    self._held[t.key] = t
                    p = t.due.pointer
                    heapq.heappush(self._heap, (p.due_at_ms, p.priority, next(self._seq), t))
                    added += 1
            if added:
                self._cond.notify()
        return added

    def holds(self, key: PointerKey) -> bool:
        with self._cond:
            return key in self._held

    def done(self, keys: list[PointerKey]) -> None:
        """Forget entries that were acted on or dropped (they may be added again later)."""
        with self._cond:
            for key in keys:
                self._held.pop(key, None)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def pop_due(self, max_wait_s: float = MAX_WAIT_S) -> list[Timer]:
        """Entries due by now (still held until done()); waits up to max_wait_s for the next."""
        with self._cond:
            now = self.clock()
            if not self._heap or self._heap[0][0] > now:
                wait = max_wait_s if not self._heap else min(
                    max_wait_s, (self._heap[0][0] - now) / 1000)
                self._cond.wait(wait)
                now = self.clock()
            due = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[3])
            return due

    def earliest_by_shard(self, topic_uid: uuid.UUID) -> dict[int, int]:
        """{shard: earliest due_at_ms held} of one topic: no cursor may pass these."""
        found: dict[int, int] = {}
        with self._cond:
            for t in self._held.values():
                if t.topic_uid == topic_uid:
                    s, due = t.due.pointer.shard, t.due.pointer.due_at_ms
                    found[s] = min(found.get(s, due), due)
        return found

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)
