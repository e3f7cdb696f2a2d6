"""Reading the timeline: the pointers of a topic's shards over a span, with the rows that
make them waiting (the releaser's walk: upcoming).

A pointer is *live* when its message row is at the pointer's version, is due on the server
clock (due_at <= now) and is scheduled, or leased with an expired lease. A pointer that can
never hand out its message again is *spent* and never examined again by this process (an
LRU of (id, version) pairs).
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Container, Iterator, Mapping

from app.config import Config
from app.core.timeline import LANE_STRIDE, MS_PER_DAY, bucket_of, bucket_start_ms
from app.models import MessageState, Pointer, Topic
from app.store.messages import MessageStore
from app.store.timeline import READ_AHEAD, TimelineStore

PointerKey = tuple[int, str, int]  # (topic uid as an int, message id, version): pointer_key
WAITING = ("scheduled", "leased")
SPENT_CACHE_SIZE = 200_000
# Active buckets one scan reads at most (a day of 1-minute buckets); a cursor behind a longer
# backlog catches up over several scans, the earliest buckets first.
MAX_BUCKETS_PER_SCAN = 1440
# Rows known to be spent are skipped without a state read but still read; the cap bounds one
# scan's memory. Unknown pointers (capped at SCAN_SLACK x want) become known, so scans make
# progress.
MAX_ROWS_PER_SCAN = 50_000
SCAN_SLACK = 2  # rows examined per row wanted: some are not due or lost to a racer
# Up to this many buckets a scan reads their bucket_slots rows directly (a bucket without one
# holds no pointer) instead of first asking active_buckets which ones to read.
DIRECT_BUCKETS = 4
# A lane's partitions of one bucket are read merged by due time, this many at a time (the
# first pages the timeline store requests ahead anyway); beyond it, in runs of this many.
MERGE_WIDTH = READ_AHEAD


def pointer_key(topic_uid: uuid.UUID, message_id: str, version: int) -> PointerKey:
    """The key of a topic's pointer at a version, of plain values only: Python's collector
    leaves such tuples untracked (a UUID in them would keep each one tracked), and the
    releaser keeps a key for every message it holds and every pointer it spent."""
    return topic_uid.int, message_id, version


@dataclasses.dataclass(frozen=True)
class Due:
    """A live pointer with the row that makes it live."""

    pointer: Pointer
    row: MessageState


Lane = tuple[int, int]  # (shard, fair-delivery lane)


@dataclasses.dataclass
class ScanResult:
    """Waiting pointers found; how far each shard was read (epoch ms), for its lanes read
    whole; how far each lane read in part was (`lanes_ms`); the (bucket, shard)s with a
    pointer left unread or whose row was still in flight."""

    due: list[Due]
    frontier_ms: dict[int, int]
    incomplete: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    lanes_ms: dict[Lane, int] = dataclasses.field(default_factory=dict)


def is_live(p: Pointer, row: MessageState | None, now_ms: int, ahead_ms: int = 0) -> bool:
    """May this pointer's message be leased now, to be handed out at its due time, at most
    ahead_ms from now? Never before the row's due time; a lease still running is never
    taken over, however soon it ends."""
    if row is None or row.version != p.version or row.due_at_ms > now_ms + ahead_ms:
        return False
    if row.state == "scheduled":
        return True
    return row.state == "leased" and (row.lease_expires_at_ms or 0) <= now_ms


def is_spent(p: Pointer, row: MessageState | None) -> bool:
    """Can this pointer never hand out its message again? A missing row, or one still behind
    the pointer's version, may be a write in flight (the pointer is written first, then the
    row's LWT), so such a pointer is not spent yet."""
    if row is None or row.version < p.version:
        return False
    return row.version > p.version or row.state not in WAITING


def _waiting_at(p: Pointer, row: MessageState) -> bool:
    """Whether the message is still at the pointer's version and waiting (scheduled, or
    leased until then)."""
    return row.version == p.version and row.state in WAITING


@dataclasses.dataclass
class _Partition:
    """How far a scan read one plan entry: the due time of the last pointer read, and
    whether it was read to its end."""

    last: int | None = None
    whole: bool = False


class _LaneReader:
    """The entries of one lane, pointer by pointer in due order, resumable: the entries of
    one bucket (up to MERGE_WIDTH of them at a time) are merged by (due time, id, version),
    so a scan that stops at its quota holds the lane's earliest pointers, whichever shard or
    part they are in, not the whole of the first shards."""

    def __init__(self, indexes: list[int], buckets: list[int],
                 pages: Iterator[tuple[int, Iterator[Pointer]]]) -> None:
        self.indexes = indexes
        self.buckets = buckets  # the bucket of each of indexes
        self.pages = pages
        self.loaded = 0  # entries of the lane taken from pages so far
        self.heap: list[tuple[int, str, int, int, Pointer, Iterator[Pointer]]] = []
        self.ended: list[int] = []  # entries that just ended, to be reported
        self.done = False

    def _load(self) -> None:
        """Open the next run of entries of one bucket and put each one's head on the heap."""
        first = self.loaded
        while (self.loaded < len(self.indexes) and self.loaded - first < MERGE_WIDTH
               and self.buckets[self.loaded] == self.buckets[first]):
            found = next(self.pages)
            index = self.indexes[found[0]]
            self.loaded += 1
            self._push(index, found[1])

    def _push(self, index: int, pointers: Iterator[Pointer]) -> None:
        p = next(pointers, None)
        if p is None:
            self.ended.append(index)
        else:
            heapq.heappush(self.heap, (p.due_at_ms, p.id, p.version, index, p, pointers))

    def next(self) -> tuple[int, Pointer | None] | None:
        """(plan index, its next pointer, or None when that entry just ended); None at the
        lane's end."""
        while not self.done:
            if self.ended:
                return self.ended.pop(), None
            if self.heap:
                *_, index, p, pointers = heapq.heappop(self.heap)
                self._push(index, pointers)
                return index, p
            if self.loaded == len(self.indexes):
                self.done = True
                return None
            self._load()
        return None


class _Reads:
    """The pointers one scan collects across its lanes, within its caps."""

    def __init__(self, scanner: DueScanner, topic: Topic, quota: int,
                 skip: Callable[[PointerKey], bool]) -> None:
        self.spent = scanner.spent
        self.topic_uid = topic.uid
        self.quota = quota
        self.skip = skip
        self.unknown: list[Pointer] = []
        self.read = 0
        self.progress: dict[int, _Partition] = {}

    def full(self) -> bool:
        return len(self.unknown) >= self.quota or self.read >= MAX_ROWS_PER_SCAN

    def run(self, reader: _LaneReader, more: int) -> None:
        """Read on in this lane until it gave `more` unknown pointers, its end or a cap."""
        until = len(self.unknown) + more
        while len(self.unknown) < until and not self.full():
            step = reader.next()
            if step is None:
                return
            index, p = step
            state = self.progress.setdefault(index, _Partition())
            if p is None:
                state.whole = True
                continue
            self.read += 1
            state.last = p.due_at_ms
            key = pointer_key(self.topic_uid, p.id, p.version)
            if key in self.spent or self.skip(key):
                continue
            self.unknown.append(p)


class SpentPointers:
    """Process-local LRU of pointers known to be spent, keyed by pointer_key."""

    def __init__(self, capacity: int = SPENT_CACHE_SIZE) -> None:
        self._keys: OrderedDict[PointerKey, None] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def add(self, topic_uid: uuid.UUID, p: Pointer) -> None:
        self.add_key(pointer_key(topic_uid, p.id, p.version))

    def add_key(self, key: PointerKey) -> None:
        with self._lock:
            self._keys[key] = None
            if len(self._keys) > self._capacity:
                self._keys.popitem(last=False)

    def discard(self, key: PointerKey) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __contains__(self, key: PointerKey) -> bool:
        with self._lock:
            return key in self._keys


def _below(ms: int, limit_ms: int | None) -> int:
    return ms if limit_ms is None else min(ms, limit_ms)


class DueScanner:
    def __init__(self, timeline: TimelineStore, messages: MessageStore, config: Config) -> None:
        self.timeline = timeline
        self.messages = messages
        self.config = config
        self.spent = SpentPointers()
        self.pointers_read = 0  # since start, for stats and tests (approximate across threads)

    def _partitions(self, topic: Topic, cursors: dict[int, int], horizon_ms: int,
                    lanes: Mapping[Lane, int] | None = None, closed: Container[Lane] = ()
                    ) -> tuple[list[tuple[int, int, int, int, int]], int | None]:
        """(bucket, shard, part, from_ms, to_ms) to read, in timeline order: the pointers of
        every shard in `cursors` at or after its cursor (a lane in `lanes` from the earlier of
        that and its own start; one in `closed` not at all) and due by horizon_ms; and, when
        more than MAX_BUCKETS_PER_SCAN buckets hold pointers in that span, the start (epoch
        ms) of the first one left out: no cursor may pass it. The span starts no earlier than
        the retention window (plus a day) before horizon_ms, where every pointer has
        expired."""
        bucket_ms = self.config.bucket_ms
        lanes = {k: ms for k, ms in (lanes or {}).items() if k[0] in cursors}
        floor = max(min([*cursors.values(), *lanes.values()]),
                    horizon_ms - (self.config.retention_days + 1) * MS_PER_DAY)
        first, last = bucket_of(floor, bucket_ms), bucket_of(horizon_ms, bucket_ms)
        cap = self.config.partition_cap
        limit_ms = None
        if last - first < DIRECT_BUCKETS:  # their slot rows say which are active: one read
            parts = self.timeline.parts(topic.uid, range(first, last + 1), cap)
            active = sorted(parts)
        else:
            active = self.timeline.active_buckets(topic.uid, first, last, bucket_ms)
            if len(active) > MAX_BUCKETS_PER_SCAN:
                limit_ms = bucket_start_ms(active[MAX_BUCKETS_PER_SCAN], bucket_ms)
                active = active[:MAX_BUCKETS_PER_SCAN]
            parts = self.timeline.parts(topic.uid, active, cap) if active else {}
        plan: list[tuple[int, int, int, int, int]] = []
        for bucket in active:
            end = min(bucket_start_ms(bucket + 1, bucket_ms) - 1, horizon_ms)
            for shard, found in sorted(parts.get(bucket, {}).items()):
                if shard not in cursors:
                    continue
                for part in sorted(found):
                    lane = (shard, part // LANE_STRIDE)
                    start = min(cursors[shard], lanes.get(lane, cursors[shard]))
                    if lane not in closed and start <= end:
                        plan.append((bucket, shard, part, start, end))
        return plan, limit_ms

    def upcoming(self, topic: Topic, starts: dict[int, int], to_ms: int, want: int,
                 pending: Callable[[PointerKey], bool], lanes: Mapping[Lane, int] | None = None,
                 closed: Container[Lane] = ()) -> ScanResult:
        """What a releaser's walk holds (its broker): pointers of the shards
        in `starts`, due from starts[shard] (a lane in `lanes` from the earlier of that and
        its own start; one in `closed` not at all) to to_ms, whose message is still at that
        version and waiting (scheduled, or leased until then). Skips spent pointers and those
        pending(key) says the caller already holds; stale pointers found become spent.
        frontier_ms says how far each shard was read (less than to_ms when the buckets cap
        stopped it); lanes_ms how far each lane the quota stopped was (its read goes on from
        there: the other lanes of its shard are not held back by its backlog); `incomplete`
        the (bucket, shard)s with a pointer left unread or whose row was still in flight
        (workers.walk reads those again)."""
        plan, limit_ms = self._partitions(topic, starts, to_ms, lanes, closed)
        frontier = dict.fromkeys(starts, _below(to_ms, limit_ms))
        lanes_ms: dict[Lane, int] = {}
        fresh, whole = self._read(topic, plan, want, pending, lanes_ms)
        due, unsettled = self._settle(topic, fresh, _waiting_at)
        partly = {(e[0], e[1]) for i, e in enumerate(plan) if i not in whole}
        return ScanResult(due, frontier, partly | unsettled, lanes_ms)

    def _settle(self, topic: Topic, pointers: list[Pointer],
                wanted: Callable[[Pointer, MessageState], bool]
                ) -> tuple[list[Due], set[tuple[int, int]]]:
        """Read the rows of pointers: those `wanted` as Due, spent ones remembered, and the
        (bucket, shard)s holding a pointer whose row is still in flight (neither)."""
        rows = self.messages.get_many(topic.uid, [p.id for p in pointers]) if pointers else {}
        due, unsettled = [], set()
        for p in pointers:
            row = rows.get(p.id)
            if row is not None and wanted(p, row):
                due.append(Due(p, row))
            elif is_spent(p, row):
                self.spent.add(topic.uid, p)
            else:
                unsettled.add((bucket_of(p.due_at_ms, self.config.bucket_ms), p.shard))
        return due, unsettled

    def _read(self, topic: Topic, plan: list[tuple[int, int, int, int, int]], want: int,
              skip: Callable[[PointerKey], bool], lanes_ms: dict[Lane, int]
              ) -> tuple[list[Pointer], set[int]]:
        """Pointers of the plan not known to be spent nor skipped, up to the scan's caps; and
        the plan entries read whole. Lowers each (shard, lane)'s entry of lanes_ms to what
        its partitions not read whole left unread.

        Each fair-delivery lane (app.core.timeline.lane_of) is read on its own, in due order
        (_LaneReader): first every lane up to its share of the scan's quota, then the lanes
        with more, in turn, up to the quota; so a lane with a backlog cannot keep the
        others' due messages out of the scan."""
        quota = min(SCAN_SLACK * want, MAX_ROWS_PER_SCAN)
        lanes: dict[int, list[int]] = defaultdict(list)
        for index, entry in enumerate(plan):
            lanes[entry[2] // LANE_STRIDE].append(index)
        reads = _Reads(self, topic, quota, skip)
        # pages of about the plan's share of what the scan wants; the first page of every
        # partition of a lane (up to READ_AHEAD of them) is requested at once
        page = -(-quota // max(1, len(plan)))
        readers = []
        for indexes in lanes.values():
            pages = self.timeline.pointers_of(topic.uid, [plan[i] for i in indexes], page)
            readers.append(_LaneReader(indexes, [plan[i][0] for i in indexes], pages))
        share = -(-quota // len(readers)) if readers else 0
        for reader in readers:
            reads.run(reader, share)
        for reader in readers:
            reads.run(reader, quota)
        self.pointers_read += reads.read
        whole = {i for i, state in reads.progress.items() if state.whole}
        for index, (bucket, shard, part, _, _) in enumerate(plan):
            if index in whole:
                continue
            partly = reads.progress.get(index)
            # a partition not read at all holds nothing before its bucket; one read in part,
            # nothing unread before the last pointer read
            limit = bucket_start_ms(bucket, self.config.bucket_ms) \
                if partly is None or partly.last is None else partly.last
            lane = (shard, part // LANE_STRIDE)
            lanes_ms[lane] = min(lanes_ms.get(lane, limit), limit)
        return reads.unknown, whole

    def forget(self, topic: Topic, pointers: list[Pointer]) -> None:
        """Make pointers examinable again (an outcome could not be recorded: look again)."""
        for p in pointers:
            self.spent.discard(pointer_key(topic.uid, p.id, p.version))

    def spend_versions(self, topic: Topic, versions: list[tuple[str, int]]) -> None:
        """Remember the pointers of these (message id, version)s as spent (acted on
        elsewhere: a give-back left the version behind)."""
        for message_id, version in versions:
            self.spent.add_key(pointer_key(topic.uid, message_id, version))

    def spend(self, topic: Topic, pointers: list[Pointer]) -> None:
        """Remember pointers this process has acted on (leased, lost a race, made dead)."""
        for p in pointers:
            self.spent.add(topic.uid, p)

    def advance(self, topic: Topic, moves: dict[int, int]) -> None:
        """Persist cursor moves (only forward; concurrent advances converge on the furthest)."""
        if moves:
            self.timeline.advance_cursors(topic.uid, moves)
