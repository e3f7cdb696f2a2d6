"""Finding due messages: walk each shard's timeline forward from its cursor up to now.

A pointer is *live* when its message row is at the pointer's version, is due on the server
clock (due_at <= now) and is scheduled, or leased with an expired lease. Every other pointer is
*spent* and never examined again by this process (an LRU of (id, version) pairs). A cursor
moves to the first live-but-untaken pointer, never past now - safety lag (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable

from app.config import Config
from app.models import MessageState, Pointer, Topic
from app.store.messages import MessageStore
from app.store.timeline import PointerPosition, TimelineStore
from app.timeline import bucket_of, bucket_start_ms, parts_for

PointerKey = tuple[uuid.UUID, str, int]  # (topic_uid, message id, version)
WAITING = ("scheduled", "leased")
SPENT_CACHE_SIZE = 200_000
MAX_BUCKETS_PER_SCAN = 1440  # a day of 1-minute buckets; a far-behind cursor catches up in steps
# Rows known to be spent are skipped without a state read but still read; the cap bounds one
# scan's memory. Unknown pointers (capped at SCAN_SLACK x want) become known, so scans make
# progress.
MAX_ROWS_PER_SCAN = 50_000
SCAN_SLACK = 2  # rows examined per row wanted: some are not due or lost to a racer
RESUME_CACHE_SIZE = 100_000
# Up to this many buckets a scan reads their bucket_slots rows directly (a bucket without one
# holds no pointer) instead of first asking active_buckets which ones to read.
DIRECT_BUCKETS = 4


@dataclasses.dataclass(frozen=True)
class Due:
    """A live pointer with the row that makes it live."""

    pointer: Pointer
    row: MessageState


@dataclasses.dataclass
class ScanResult:
    """Live pointers found; how far each shard's cursor could move were they all taken; the
    cursors the scan started from."""

    due: list[Due]
    frontier_ms: dict[int, int]
    cursors_ms: dict[int, int]

    def moves(self, untaken: list[Due]) -> dict[int, int]:
        """Cursor moves once the live pointers not in `untaken` are spent: no cursor passes
        an untaken live pointer."""
        frontier = dict(self.frontier_ms)
        for d in untaken:
            shard = d.pointer.shard
            frontier[shard] = min(frontier[shard], d.pointer.due_at_ms)
        return {s: ms for s, ms in frontier.items() if ms > self.cursors_ms[s]}


def is_live(p: Pointer, row: MessageState | None, now_ms: int) -> bool:
    """May this pointer hand out its message now? Never before the row's due time."""
    if row is None or row.version != p.version or row.due_at_ms > now_ms:
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


def _remember(seen: dict[tuple[int, int], int], counts: dict[tuple[int, int], int],
              read_whole: list[tuple[int, int, int, int, int]],
              unsettled: set[tuple[int, int]]) -> None:
    """Record the write counts of (bucket, shard)s read whole with every pointer settled."""
    for bucket, shard, *_ in read_whole:
        key = (bucket, shard)
        if key in counts and key not in unsettled:
            seen[key] = counts[key]


class SpentPointers:
    """Process-local LRU of pointers known to be spent, keyed (topic_uid, id, version)."""

    def __init__(self, capacity: int = SPENT_CACHE_SIZE) -> None:
        self._keys: OrderedDict[PointerKey, None] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def add(self, topic_uid: uuid.UUID, p: Pointer) -> None:
        self.add_key((topic_uid, p.id, p.version))

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


class ResumePoints:
    """Per timeline partition, the last pointer of a prefix this process found all spent, due
    before the safety lag: the next read of the partition starts after it. A cursor is a time
    only, so without this a minute's pile-up at one millisecond (a campaign at 09:00:00.000)
    would be re-read from its first pointer by every scan until all of it is taken.

    Safe as the cursor is: nothing new lands before now - safety lag but a straggler, and the
    catch-up finds those once the cursor passes them. Thread-safe; bounded LRU."""

    def __init__(self, capacity: int = RESUME_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._points: OrderedDict[tuple[uuid.UUID, int, int, int], PointerPosition] = (
            OrderedDict())
        self._lock = threading.Lock()

    def get(self, key: tuple[uuid.UUID, int, int, int], from_ms: int) -> PointerPosition | None:
        """Where to resume reading this partition, when that is beyond from_ms."""
        with self._lock:
            point = self._points.get(key)
        return point if point is not None and point[0] >= from_ms else None

    def advance(self, key: tuple[uuid.UUID, int, int, int], point: PointerPosition) -> None:
        with self._lock:
            known = self._points.get(key)
            if known is None or point > known:
                self._points[key] = point
                self._points.move_to_end(key)
                while len(self._points) > self.capacity:
                    self._points.popitem(last=False)


class DueScanner:
    def __init__(self, timeline: TimelineStore, messages: MessageStore, config: Config) -> None:
        self.timeline = timeline
        self.messages = messages
        self.config = config
        self.spent = SpentPointers()
        self.resume = ResumePoints()
        self.pointers_read = 0  # since start, for stats and tests (approximate across threads)

    def _partitions(self, topic: Topic, cursors: dict[int, int],
                    horizon_ms: int) -> list[tuple[int, int, int, int, int]]:
        """(bucket, shard, part, from_ms, to_ms) to read, in timeline order: the pointers of
        every shard in `cursors` at or after its cursor and due by horizon_ms."""
        bucket_ms = self.config.bucket_ms
        floor = min(cursors.values())
        first, last = bucket_of(floor, bucket_ms), bucket_of(horizon_ms, bucket_ms)
        first = max(first, last - MAX_BUCKETS_PER_SCAN)
        if last - first < DIRECT_BUCKETS:  # their slot rows say which are active: one read
            slots = self.timeline.slots(topic.uid, range(first, last + 1))
            active = sorted(slots)
        else:
            active = self.timeline.active_buckets(topic.uid, first, last, bucket_ms)
            slots = self.timeline.slots(topic.uid, active) if active else {}
        plan: list[tuple[int, int, int, int, int]] = []
        for bucket in active:
            end = min(bucket_start_ms(bucket + 1, bucket_ms) - 1, horizon_ms)
            for shard, next_slot in sorted(slots.get(bucket, {}).items()):
                start = cursors.get(shard, end + 1)
                if start <= end:
                    plan.extend((bucket, shard, part, start, end) for part in
                                range(parts_for(next_slot, self.config.partition_cap)))
        return plan

    def _stopped_at(self, plan: list[tuple[int, int, int, int, int]], index: int,
                    last_due_ms: int, frontier: dict[int, int]) -> None:
        """The scan stopped inside plan[index] after a pointer due at last_due_ms: no shard's
        cursor may pass what this scan did not read."""
        bucket, shard = plan[index][0], plan[index][1]
        unread = {(b, s) for b, s, *_ in plan[index + 1:]}
        for s in frontier:
            if (bucket, s) in unread:  # parts of one (bucket, shard) overlap in time
                limit = bucket_start_ms(bucket, self.config.bucket_ms)
            elif s == shard:  # its earlier parts were read whole; this one up to last_due_ms
                limit = last_due_ms
            else:
                limit = bucket_start_ms(bucket + 1, self.config.bucket_ms)
            frontier[s] = min(frontier[s], limit)

    def scan(self, topic: Topic, now_ms: int, want: int, shards: set[int] | None = None,
             stored: dict[int, int] | None = None) -> ScanResult:
        """Live pointers due by now_ms (at most about SCAN_SLACK x want) of the topic's shards
        (or of `shards`), and per-shard frontiers."""
        stored = self.timeline.cursors(topic.uid) if stored is None else stored
        default = topic.created_at_ms - self.config.safety_lag_ms
        cursors = {s: stored.get(s, default) for s in range(topic.settings.shards)
                   if shards is None or s in shards}
        if not cursors:
            return ScanResult([], {}, {})
        frontier = {s: now_ms - self.config.safety_lag_ms for s in cursors}
        plan = self._partitions(topic, cursors, now_ms)
        unknown, _ = self._read(topic, plan, want, frontier, lambda key: False,
                                now_ms - self.config.safety_lag_ms)
        due, _ = self._settle(topic, unknown, lambda p, row: is_live(p, row, now_ms))
        return ScanResult(due, frontier, cursors)

    def upcoming(self, topic: Topic, starts: dict[int, int], to_ms: int, want: int,
                 pending: Callable[[PointerKey], bool],
                 seen: dict[tuple[int, int], int] | None = None) -> ScanResult:
        """What a releaser holds in its timer heap: pointers of the shards in `starts`, due
        from starts[shard] to to_ms, whose message is still at that version and waiting
        (scheduled, or leased until then). Skips spent pointers and those pending(key) says
        the caller already holds; stale pointers found become spent. frontier_ms says how far
        each shard was read (less than to_ms when the scan's caps stopped it).

        With `seen` ({(bucket, shard): write count when last read whole}), a (bucket, shard)
        whose write count has not moved is not read again; `seen` is updated for those read
        whole with every pointer settled (a pointer whose row is still in flight keeps its
        partition due for another read)."""
        frontier = dict.fromkeys(starts, to_ms)
        plan = self._partitions(topic, starts, to_ms)
        counts: dict[tuple[int, int], int] = {}
        if seen is not None:
            counts = self.timeline.write_counts(topic.uid, sorted({e[0] for e in plan}))
            plan = [e for e in plan if (e[0], e[1]) not in seen
                    or counts.get((e[0], e[1])) != seen[(e[0], e[1])]]
        fresh, stopped = self._read(topic, plan, want, frontier, pending)
        due, unsettled = self._settle(
            topic, fresh, lambda p, row: row.version == p.version and row.state in WAITING)
        if seen is not None:
            _remember(seen, counts, plan[:stopped], unsettled)
        return ScanResult(due, frontier, starts)

    def stragglers(self, topic: Topic, cursors: dict[int, int], since_ms: int,
                   seen: dict[tuple[int, int], int], now_ms: int) -> list[Due]:
        """Waiting messages whose pointer landed behind its shard's cursor (a writer slower or
        with a clock further behind than the safety lag: a long bulk import, a skewed host).
        Only (bucket, shard)s of the shards in `cursors`, from since_ms on, whose write count
        moved since `seen` are read, so this costs one small read per sweep when nothing
        straggles. Updates `seen`."""
        if not cursors:
            return []
        bucket_ms = self.config.bucket_ms
        buckets = self.timeline.active_buckets(topic.uid, bucket_of(since_ms, bucket_ms),
                                               bucket_of(max(cursors.values()), bucket_ms),
                                               bucket_ms)
        counts = self.timeline.write_counts(topic.uid, buckets) if buckets else {}
        changed = {k: n for k, n in counts.items() if k[1] in cursors and seen.get(k) != n}
        if not changed:
            return []
        slots = self.timeline.slots(topic.uid, sorted({b for b, _ in changed}))
        cap = self.config.partition_cap
        plan = [(b, sh, part, bucket_start_ms(b, bucket_ms),
                 min(bucket_start_ms(b + 1, bucket_ms), cursors[sh]) - 1)
                for b, sh in sorted(changed)
                for part in range(parts_for(slots.get(b, {}).get(sh, 0), cap))]
        frontier = dict.fromkeys(cursors, now_ms)
        behind, stopped = self._read(topic, plan, MAX_ROWS_PER_SCAN, frontier, lambda key: False,
                                     now_ms - self.config.safety_lag_ms)
        found, unsettled = self._settle(topic, behind, lambda p, row: is_live(p, row, now_ms))
        _remember(seen, changed, plan[:stopped], unsettled)
        return found

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
              frontier: dict[int, int], skip: Callable[[PointerKey], bool],
              settled_ms: int | None = None) -> tuple[list[Pointer], int]:
        """Pointers of the plan not known to be spent nor skipped, up to the scan's caps; and
        how many plan entries were read whole. With settled_ms, each partition is read from
        its resume point, and a spent prefix due before settled_ms moves that point."""
        keys = [(topic.uid, b, s, part) for b, s, part, _, _ in plan]
        after = ([self.resume.get(k, e[3]) for k, e in zip(keys, plan, strict=True)]
                 if settled_ms is not None else None)
        unknown: list[Pointer] = []
        read = 0
        # pages of about the plan's share of what the scan wants: it stops after
        # SCAN_SLACK x want unknown pointers, and the first page of every partition (up to
        # READ_AHEAD of them) is requested at once
        page = -(-min(SCAN_SLACK * want, MAX_ROWS_PER_SCAN) // max(1, len(plan)))
        for index, pointers in self.timeline.pointers_of(topic.uid, plan, after, page):
            spent_prefix: PointerPosition | None = None
            in_prefix = settled_ms is not None
            for p in pointers:
                read += 1
                key = (topic.uid, p.id, p.version)
                known = key in self.spent
                if in_prefix and known and p.due_at_ms < (settled_ms or 0):
                    spent_prefix = (p.due_at_ms, p.id, p.version)
                else:
                    in_prefix = False
                if not known and not skip(key):
                    unknown.append(p)
                if len(unknown) >= SCAN_SLACK * want or read >= MAX_ROWS_PER_SCAN:
                    if spent_prefix:
                        self.resume.advance(keys[index], spent_prefix)
                    self._stopped_at(plan, index, p.due_at_ms, frontier)
                    self.pointers_read += read
                    return unknown, index
            if spent_prefix:
                self.resume.advance(keys[index], spent_prefix)
        self.pointers_read += read
        return unknown, len(plan)

    def forget(self, topic: Topic, pointers: list[Pointer]) -> None:
        """Make pointers examinable again (an outcome could not be recorded: look again)."""
        for p in pointers:
            self.spent.discard((topic.uid, p.id, p.version))

    def spend_versions(self, topic: Topic, versions: list[tuple[str, int]]) -> None:
        """Remember the pointers of these (message id, version)s as spent (acted on
        elsewhere: an ack, nack or extend left the version behind)."""
        for message_id, version in versions:
            self.spent.add_key((topic.uid, message_id, version))

    def spend(self, topic: Topic, pointers: list[Pointer]) -> None:
        """Remember pointers this process has acted on (leased, lost a race, made dead)."""
        for p in pointers:
            self.spent.add(topic.uid, p)

    def advance(self, topic: Topic, moves: dict[int, int]) -> None:
        """Persist cursor moves (only forward; concurrent advances converge on the furthest)."""
        if moves:
            self.timeline.advance_cursors(topic.uid, moves)
