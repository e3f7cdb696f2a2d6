"""In-memory timer heaps of a releaser: entries read ahead, handed out at (or just before)
their due time.

pop_due(ahead_ms) returns an entry only once the clock reads at or after its due time minus
ahead_ms; with ahead_ms = 0 that is never early. Among entries due together, lower priority
values come first. Each key is held once, from add() until done().
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
import uuid
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from app.delivery.scan import Due, PointerKey, pointer_key
from app.services import Clock

MAX_WAIT_S = 0.05


class Timed(Protocol):
    @property
    def key(self) -> Hashable: ...

    @property
    def due_ms(self) -> int: ...

    @property
    def priority(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class Timer:
    """One pointer waiting for its moment, with the topic and release slot it belongs to."""

    topic_uid: uuid.UUID
    slot: int
    due: Due

    @property
    def key(self) -> PointerKey:
        return pointer_key(self.topic_uid, self.due.pointer.id, self.due.pointer.version)

    @property
    def due_ms(self) -> int:
        return self.due.pointer.due_at_ms

    @property
    def priority(self) -> int:
        return self.due.pointer.priority


T = TypeVar("T", bound=Timed)


class TimerHeap(Generic[T]):
    """Thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[int, int, int, T]] = []
        self._held: dict[Hashable, T] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def add(self, items: list[T]) -> int:
        """Schedule items whose key is not already held; returns how many were new."""
        added = 0
        with self._cond:
            for item in items:
                if item.key not in self._held:
                    self._held[item.key] = item
                    heapq.heappush(self._heap,
                                   (item.due_ms, item.priority, next(self._seq), item))
                    added += 1
            if added:
                self._cond.notify()
        return added

    def holds(self, key: Hashable) -> bool:
        with self._cond:
            return key in self._held

    def done(self, keys: list[Hashable]) -> None:
        """Forget entries that were acted on or dropped (they may be added again later)."""
        with self._cond:
            for key in keys:
                self._held.pop(key, None)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def pop_due(self, ahead_ms: int = 0, max_wait_s: float = MAX_WAIT_S) -> list[T]:
        """Entries due by now + ahead_ms (still held until done()); waits up to max_wait_s
        for the next one."""
        with self._cond:
            horizon = self.clock() + ahead_ms
            if not self._heap or self._heap[0][0] > horizon:
                wait = max_wait_s if not self._heap else min(
                    max_wait_s, (self._heap[0][0] - horizon) / 1000)
                self._cond.wait(wait)
                horizon = self.clock() + ahead_ms
            due = []
            while self._heap and self._heap[0][0] <= horizon:
                due.append(heapq.heappop(self._heap)[3])
            return due

    def rest(self, seconds: float, ahead_ms: int) -> None:
        """Wait up to `seconds`, less when an entry due by now + ahead_ms is waiting: one
        added meanwhile (found late: a topic made a moment ago, a message due at once) is
        popped now, not a rest later. Entries further ahead do not end the rest, so a pass
        still pops a period's worth at once."""
        with self._cond:
            self._cond.wait_for(
                lambda: bool(self._heap) and self._heap[0][0] <= self.clock() + ahead_ms,
                max(0.0, seconds))

    def waiting(self) -> int:
        """Entries added and not yet popped."""
        with self._cond:
            return len(self._heap)

    def items(self) -> list[T]:
        """Every held entry (popped or not), a snapshot."""
        with self._cond:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)
