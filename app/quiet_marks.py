"""What a lease pass over a quiet topic saw, so that the passes after it can check one small
row instead of reading every shard's partitions again (app.leasing).

A long poll on a quiet topic rests (app.poll_groups.PollGroups.rest) and reads again at
least once an idle period (Config.pull_idle_ms) in case a wake-up was lost. Each such read
costs a request per shard partition. A pass that found nothing due leaves a mark instead:
the topic's `bucket_writes` counts of the buckets where a new pointer could land, read before
its timeline read, and how far that read saw (its peek). A later pass whose window ends
within both the peek and COUNTED_AHEAD_MS (less the safety lag) of that read, and finds the
same counts, knows nothing was written that it could lease:
- a pointer that was there at the read and due by the peek's end was seen by it;
- one written after the read is due no earlier than its writer's clock then (placement
  clamps to now), which is at most the safety lag behind this clock, so it lands in the
  buckets the mark counted; if due within the mark's window, it is due within
  COUNTED_AHEAD_MS of its writer's clock, so its write was counted
  (app.placement.PointerPlacer.place).
A pointer that lands further behind (a writer whose clock is off by more than the safety
lag, a long bulk import) is a straggler: it is read when the mark runs out, as it is by any
pass while the cursors have not passed it.
A count is bumped after its pointers are durable and its request is not awaited, so the
writer's datagram (app.pull_wakes) can come first: any wake-up of the topic drops its mark
(`forget`), and a pass keeps one only when no wake-up came since it began (`generation`).
A lost count bump delays a message by at most the mark's life (about 9 s by default), and
only when the wake-up was lost too. The pass a wake-up starts leaves no mark (`woken`): it
is the one that hands the new message out, and reading the counts first would add a round
trip to it; the idle read after it leaves one.

Cell marks are the same reasoning per (bucket, shard) of a topic that is not quiet: every pass
reads the write counts beside its cursors, and leaves a mark on each (bucket, shard) it read
whole where nothing was due or in flight, with how far the read saw there (up to the first
pointer not known spent past its window: its peek of that partition). A later pass does not
read a marked (bucket, shard) whose count has not moved, while its window ends before the
mark's seen_through_ms and within COUNTED_AHEAD_MS less the safety lag of the mark's count
read. So a consumer on a topic with a message due now and then costs a read of the
partitions where something can have changed, not of every shard at every pass. A wake-up
drops the topic's cell marks too, and a pass keeps them only when none came since it began.

Thread-safe; process-local; bounded (least recently used marks go first).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections import OrderedDict
from typing import TypeVar

from app.timeline import COUNTED_AHEAD_MS, bucket_of

MAX_TOPICS = 10_000  # marks and generations kept; a topic forgotten just reads again


@dataclasses.dataclass(frozen=True)
class QuietMark:
    """read_at_ms: the reader's clock when the counts were read (epoch ms, before the
    timeline read); buckets: those the counts cover; counts: {(bucket, shard): pointers
    written}; seen_through_ms: every pointer due before it was read or known spent."""

    read_at_ms: int
    buckets: tuple[int, ...]
    counts: dict[tuple[int, int], int]
    seen_through_ms: int


@dataclasses.dataclass(frozen=True)
class CellMark:
    """What a pass's read saw of one (bucket, shard): read_at_ms, the reader's clock when
    the count was read (epoch ms, before the timeline read); count, the (bucket, shard)'s
    write count then (None: none yet); seen_through_ms, every pointer there due before it
    was known spent after that read."""

    read_at_ms: int
    count: int | None
    seen_through_ms: int

    def stands(self, count: int | None, window_end_ms: int, safety_lag_ms: int) -> bool:
        """Can this mark stand for a pass whose window ends at window_end_ms (epoch ms) and
        which read the (bucket, shard)'s write count as `count`?"""
        return (count == self.count and window_end_ms < self.seen_through_ms
                and window_end_ms <= self.read_at_ms + COUNTED_AHEAD_MS - safety_lag_ms)


Cell = tuple[int, int]  # (bucket, shard)


def buckets_to_count(now_ms: int, bucket_ms: int, safety_lag_ms: int) -> tuple[int, ...]:
    """The buckets a pointer written from now_ms on and counted can be in: due from now_ms
    less the safety lag (another process's clock) to COUNTED_AHEAD_MS ahead."""
    first = bucket_of(now_ms - safety_lag_ms, bucket_ms)
    return tuple(range(first, bucket_of(now_ms + COUNTED_AHEAD_MS, bucket_ms) + 1))


def peek_ms(idle_ms: int, ahead_ms: int, safety_lag_ms: int) -> int:
    """How far past its window a resting pass reads: as far as a mark can stand for it."""
    return max(idle_ms, COUNTED_AHEAD_MS - safety_lag_ms - ahead_ms)


K = TypeVar("K")
V = TypeVar("V")


def _put(lru: OrderedDict[K, V], key: K, value: V, capacity: int) -> None:
    """Store as the most recently used entry; the least recently used go past capacity."""
    lru[key] = value
    lru.move_to_end(key)
    while len(lru) > capacity:
        lru.popitem(last=False)


class QuietMarks:
    def __init__(self, safety_lag_ms: int, capacity: int = MAX_TOPICS) -> None:
        self.safety_lag_ms = safety_lag_ms
        self.capacity = capacity
        self._marks: OrderedDict[uuid.UUID, QuietMark] = OrderedDict()
        self._cells: OrderedDict[uuid.UUID, dict[Cell, CellMark]] = OrderedDict()
        # topics whose last pass could mark few of the (bucket, shard)s it read: a peek for
        # marks there would fetch pointers past the window for nothing (kept across wake-ups)
        self._dense: OrderedDict[uuid.UUID, bool] = OrderedDict()
        # per topic the sequence number of its last wake-up; a topic not listed has had none
        # since the last one evicted (its generation is then _floor)
        self._generations: OrderedDict[uuid.UUID, int] = OrderedDict()
        self._woken: set[uuid.UUID] = set()  # woken since their last pass began
        self._sequence = 0
        self._floor = 0
        self._lock = threading.Lock()

    def generation(self, topic_uid: uuid.UUID) -> int:
        """Taken by a pass before its counts read, and given back to keep()."""
        with self._lock:
            return self._generation_of(topic_uid)

    def _generation_of(self, topic_uid: uuid.UUID) -> int:
        """The topic's generation now (the caller holds the lock)."""
        return self._generations.get(topic_uid, self._floor)

    def keep(self, topic_uid: uuid.UUID, mark: QuietMark, generation: int) -> bool:
        """Keep the mark, unless the topic was woken since generation() returned
        `generation`. Returns whether it was kept."""
        with self._lock:
            if self._generation_of(topic_uid) != generation:
                return False
            _put(self._marks, topic_uid, mark, self.capacity)
            return True

    def keep_cells(self, topic_uid: uuid.UUID, cells: dict[Cell, CellMark],
                   generation: int, dense: bool) -> bool:
        """Keep these cell marks as the topic's (replacing the ones before), unless the topic
        was woken since generation() returned `generation`; and whether the pass that made
        them found the topic dense (few (bucket, shard)s it read could be marked). Returns
        whether the marks were kept."""
        with self._lock:
            _put(self._dense, topic_uid, dense, self.capacity)
            if self._generation_of(topic_uid) != generation:
                return False
            _put(self._cells, topic_uid, cells, self.capacity)
            return True

    def cells(self, topic_uid: uuid.UUID) -> dict[Cell, CellMark]:
        """The topic's cell marks (none after a wake-up)."""
        with self._lock:
            return self._cells.get(topic_uid, {})

    def dense(self, topic_uid: uuid.UUID) -> bool:
        """Did the topic's last pass find it dense (keep_cells)? False when unknown."""
        with self._lock:
            return self._dense.get(topic_uid, False)

    def standing(self, topic_uid: uuid.UUID, window_end_ms: int) -> QuietMark | None:
        """The topic's mark, if it can stand for a pass whose window ends at window_end_ms
        (epoch ms: its clock plus its look-ahead) once its counts are found unchanged."""
        with self._lock:
            mark = self._marks.get(topic_uid)
        if mark is None or window_end_ms > self.stands_until(mark):
            return None
        return mark

    def stands_until(self, mark: QuietMark) -> int:
        """The last window end (epoch ms) for which the mark can stand."""
        return min(mark.seen_through_ms - 1,
                   mark.read_at_ms + COUNTED_AHEAD_MS - self.safety_lag_ms)

    def woken(self, topic_uid: uuid.UUID) -> bool:
        """Was the topic woken since the last pass that asked? (Such a pass leaves no mark.)"""
        with self._lock:
            if topic_uid in self._woken:
                self._woken.discard(topic_uid)
                return True
            return False

    def forget(self, topic_uid: uuid.UUID) -> None:
        """Something was written to the topic, or may have been: the next pass reads."""
        with self._lock:
            self._marks.pop(topic_uid, None)
            self._cells.pop(topic_uid, None)
            self._woken.add(topic_uid)
            self._sequence += 1
            self._generations[topic_uid] = self._sequence
            self._generations.move_to_end(topic_uid)
            while len(self._generations) > self.capacity:
                evicted, self._floor = self._generations.popitem(last=False)
                self._marks.pop(evicted, None)
                self._cells.pop(evicted, None)
                self._woken.discard(evicted)
