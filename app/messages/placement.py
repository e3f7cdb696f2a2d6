"""Putting pointers on the timeline: partition choice, slot reservation, TTL.

Each process reserves slots of a (bucket, shard) in chunks (DUETIME_SLOT_CHUNK) with one LWT
and hands them out locally, so the LWT rate on a hot minute stays low. Unused slots of a chunk
are gaps: partitions then hold fewer than DUETIME_PARTITION_CAP pointers, never more.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

from app.config import Config
from app.core.timeline import COUNTED_AHEAD_MS, bucket_of, lane_part, ttl_s
from app.delivery.wakeups import Wake, due_kind, no_wake
from app.errors import StoreUnavailable
from app.models import Pointer
from app.store.timeline import TimelineStore

_MAX_CACHED = 20_000
LATE_TRIES = 4
AHEAD_MAX_MS = 30_000  # a pointer placed again lands before it is due, by at most this
log = logging.getLogger(__name__)


class PointerPlacer:
    """Thread-safe; one per process."""

    def __init__(self, store: TimelineStore, config: Config, cluster_now: Callable[[], int],
                 wake: Wake = no_wake,
                 pull_written: Callable[[uuid.UUID], None] | None = None) -> None:
        self.store = store
        self.config = config
        self.cluster_now = cluster_now  # app.ops.cluster_clock
        self._wake = wake  # app.delivery.wakeups
        self._pull_written = pull_written  # a pull topic's pointers due soon: app.delivery.wakeups
        self._lock = threading.Lock()
        self._ranges: dict[tuple[uuid.UUID, int, int], tuple[int, int]] = {}
        self._active: set[tuple[uuid.UUID, int]] = set()
        self._lanes: set[tuple[uuid.UUID, int, int, int]] = set()  # lane partitions recorded

    def _take(self, topic_uid: uuid.UUID, bucket: int, shard: int, count: int) -> list[int]:
        key = (topic_uid, bucket, shard)
        with self._lock:
            start, end = self._ranges.get(key, (0, 0))
            if end - start >= count:
                self._ranges[key] = (start + count, end)
                return list(range(start, start + count))
        size = max(count, self.config.slot_chunk)
        first = self.store.reserve_slots(topic_uid, bucket, shard, size)
        with self._lock:
            if len(self._ranges) > _MAX_CACHED:
                self._ranges.clear()
            self._ranges[key] = (first + count, first + size)
        return list(range(first, first + count))

    def _mark_active(self, topic_uid: uuid.UUID, buckets: set[int], now_ms: int) -> None:
        with self._lock:
            new = sorted(b for b in buckets if (topic_uid, b) not in self._active)
        if not new:
            return
        self.store.mark_active(topic_uid, new, self.config.bucket_ms, now_ms)
        with self._lock:
            if len(self._active) > _MAX_CACHED:
                self._active.clear()
            self._active.update((topic_uid, b) for b in new)

    def _record_lanes(self, topic_uid: uuid.UUID, placed: list[tuple[int, int, int, Pointer, int]],
                      now_ms: int) -> dict[tuple[int, int, int], Exception]:
        """Record the lane partitions (lanes 1..) this process has not recorded yet; returns
        those whose record failed (their pointers count as not written: a reader would not
        find them)."""
        with self._lock:
            new = sorted({(b, s, part) for b, s, part, p, _ in placed
                          if p.lane and (topic_uid, b, s, part) not in self._lanes})
        if not new:
            return {}
        retention = self.config.retention_days
        ends = [(b + 1) * self.config.bucket_ms for b, _, _ in new]
        errors = self.store.record_lanes(topic_uid, [
            (b, s, part, ttl_s(end, now_ms, retention)) for (b, s, part), end in
            zip(new, ends, strict=True)])
        with self._lock:
            if len(self._lanes) > _MAX_CACHED:
                self._lanes.clear()
            self._lanes.update((topic_uid, *key) for key, err in zip(new, errors, strict=True)
                               if err is None)
        return {key: err for key, err in zip(new, errors, strict=True) if err is not None}

    def place(self, topic_uid: uuid.UUID, pointers: Sequence[Pointer], now_ms: int,
              pushed: bool = False, landed: Callable[[], object] | None = None,
              wake: bool = True) -> list[Exception | None]:
        """Write the pointers (due times already clamped by the caller); per pointer None when
        written, else the exception. TTL: until due plus the retention window. Written
        pointers due within COUNTED_AHEAD_MS of now_ms are counted in bucket_writes. With
        `wake`, the readers are told of them once all is written (tell_landed). `landed`,
        when given, is called once the pointers are written and before anyone is told of
        them: an enqueue that writes its rows beside its pointers waits there for the rows,
        so what a reader is woken for is there to read. A move whose row's LWT comes after
        its pointer passes wake=False and tells the readers once that LWT applied."""
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for index, p in enumerate(pointers):
            groups[(bucket_of(p.due_at_ms, self.config.bucket_ms), p.shard)].append(index)
        self._mark_active(topic_uid, {bucket for bucket, _ in groups}, now_ms)
        placed: list[tuple[int, int, int, Pointer, int]] = [None] * len(pointers)  # type: ignore[list-item]
        for (bucket, shard), indexes in groups.items():
            slots = self._take(topic_uid, bucket, shard, len(indexes))
            for index, slot in zip(indexes, slots, strict=True):
                p = pointers[index]
                ttl = ttl_s(p.due_at_ms, now_ms, self.config.retention_days)
                placed[index] = (bucket, shard,
                                 lane_part(p.lane, slot, self.config.partition_cap), p, ttl)
        unrecorded = self._record_lanes(topic_uid, placed, now_ms)
        outcomes = self.store.write_pointers(topic_uid, placed)
        outcomes = [unrecorded.get((b, s, part), err)
                    for (b, s, part, _, _), err in zip(placed, outcomes, strict=True)]
        if landed is not None:
            landed()
        written = [(bucket, shard, p) for (bucket, shard, _, p, _), err
                   in zip(placed, outcomes, strict=True) if err is None]
        uncounted = self._count(topic_uid, written, now_ms)
        if wake:
            self.tell_landed(topic_uid, [p for _, _, p in written], now_ms, pushed)
        return [uncounted.get((b, s), err)
                for (b, s, _, _, _), err in zip(placed, outcomes, strict=True)]

    def _count(self, topic_uid: uuid.UUID, written: list[tuple[int, int, Pointer]],
               now_ms: int) -> dict[tuple[int, int], Exception]:
        """Count pointers just written in bucket_writes. Returns the (bucket, shard)s whose
        count failed: their pointers count as not written (a walk past them would not read
        them again), so the write is answered 503 and retried."""
        counts: dict[tuple[int, int], int] = defaultdict(int)
        # by the time the pointers landed, not their placement: a slow write's pointer
        # uncounted is one no walk could have read past yet
        counted_until = max(now_ms, self.cluster_now()) + COUNTED_AHEAD_MS
        for bucket, shard, p in written:
            if p.due_at_ms <= counted_until:
                counts[(bucket, shard)] += 1
        return self.store.count_writes(topic_uid, counts)

    def tell_landed(self, topic_uid: uuid.UUID, pointers: Sequence[Pointer], now_ms: int,
                    pushed: bool) -> None:
        """Wake the readers of pointers whose writes (pointer and row) have landed, when one
        is due within the releasers' look-ahead: their walk reads the topic and their brokers'
        long polls parked on it look again; for a pull topic this process's next wants say
        so too (pull_written). A walk woken before the row landed finds the pointer in flight
        and reads it again only at its next step."""
        if not any(p.due_at_ms <= now_ms + self.config.release_lookahead_ms for p in pointers):
            return
        self._wake(due_kind(topic_uid))
        if not pushed and self._pull_written is not None:
            self._pull_written(topic_uid)


    def again_if_late(self, topic_uid: uuid.UUID, pointers: Sequence[Pointer],
                      pushed: bool = False) -> list[Pointer]:
        """Pointers whose write (pointer, write count and row) has finished: one due more
        than half the safety lag before the cluster's time now may lie behind a walk's
        position, which reads a moved count's partition only from the safety lag before its
        last read (docs/design.md, "How a due message is found"). It is placed once more,
        with the same message version, until it lands in time, LATE_TRIES at most: due now,
        then (while writes are slow: a node down) twice the last try's write time ahead of
        now, at most AHEAD_MAX_MS, so that it lands before it is due. Returns those still
        not placed in time (writes that kept failing)."""
        late_ms = self.config.safety_lag_ms // 2
        ahead_ms = 0
        for _ in range(LATE_TRIES):
            now = self.cluster_now()
            late = [p for p in pointers if now - p.due_at_ms > late_ms]
            if not late:
                return []
            log.info("placing %d pointers of topic %s again, %d ms ahead: their write "
                     "finished late", len(late), topic_uid, ahead_ms)
            again = [dataclasses.replace(p, due_at_ms=now + ahead_ms) for p in late]
            try:
                errors = self.place(topic_uid, again, now, pushed)
            except StoreUnavailable as exc:
                errors = [exc] * len(again)
            ahead_ms = min(2 * (self.cluster_now() - now), AHEAD_MAX_MS)
            pointers = [p if err is None else old
                        for old, p, err in zip(late, again, errors, strict=True)]
        now = self.cluster_now()
        return [p for p in pointers if now - p.due_at_ms > late_ms]

