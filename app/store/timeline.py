"""Timeline pointers, slot reservations, cursors and the active-bucket index.

Guarantees:
- pointers are immutable and never deleted (they expire by TTL);
- reserve_slots hands out disjoint slot ranges of a (bucket, shard) to any number of
  concurrent callers (an LWT compare-and-set on bucket_slots);
- a cursor only ever moves forward (writes carry USING TIMESTAMP = position).
"""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from app.core.chunks import chunked
from app.core.timeline import LANE_STRIDE, MS_PER_DAY, parts_for
from app.core.timeparse import cql_ms
from app.errors import StoreUnavailable
from app.models import Pointer
from app.store.session import CassandraSession, item_errors, translate_errors

CAS_ATTEMPTS = 64
FETCH_SIZE = 500  # the largest page; callers that want fewer pointers ask for smaller pages
MIN_PAGE = 64
PointerPosition = tuple[int, str, int]  # (due_ms, id, version): a place in a partition
_POINTER_COLUMNS = "SELECT due_at, id, version, priority FROM {ks}.timeline WHERE topic_uid = ? "
_SLICE_FROM_TIME = (_POINTER_COLUMNS + "AND bucket = ? AND shard = ? AND part = ? "
                    "AND due_at >= ? AND due_at <= ?")
# one multi-column form for both bounds: CQL refuses to mix it with single-column relations
_SLICE_AFTER = (_POINTER_COLUMNS + "AND bucket = ? AND shard = ? AND part = ? "
                "AND (due_at, id, version) > (?, ?, ?) AND (due_at) <= (?)")
READ_AHEAD = 32
BATCH_ROWS = 50  # pointers per batch: under the default 5 KiB batch_size_warn_threshold
CURSOR_TOPICS = 50  # topics per cursors read (partitions of one request)


def _pointer(row: dict[str, Any], shard: int, part: int) -> Pointer:
    """A timeline row (as _POINTER_COLUMNS selects it) of a shard's partition."""
    return Pointer(cql_ms(row["due_at"]), row["id"], row["version"], row["priority"], shard,
                   part // LANE_STRIDE)


class TimelineStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def reserve_slots(self, topic_uid: uuid.UUID, bucket: int, shard: int, count: int) -> int:
        """Reserve `count` consecutive slots of (bucket, shard); returns the first."""
        expected: int | None = None
        for _ in range(CAS_ATTEMPTS):
            if expected is None:
                rows = self.db.execute(
                    "INSERT INTO {ks}.bucket_slots (topic_uid, bucket, shard, next_slot) "
                    "VALUES (?, ?, ?, ?) IF NOT EXISTS", (topic_uid, bucket, shard, count))
                if rows[0]["[applied]"]:
                    return 0
            else:
                rows = self.db.execute(
                    "UPDATE {ks}.bucket_slots SET next_slot = ? WHERE topic_uid = ? AND "
                    "bucket = ? AND shard = ? IF next_slot = ?",
                    (expected + count, topic_uid, bucket, shard, expected))
                if rows[0]["[applied]"]:
                    return expected
            expected = rows[0]["next_slot"]
            time.sleep(random.uniform(0, 0.002))  # de-synchronise contending reservers
        raise StoreUnavailable("slot reservation contended; retry")

    def parts(self, topic_uid: uuid.UUID, buckets: Sequence[int], partition_cap: int
              ) -> dict[int, dict[int, list[int]]]:
        """{bucket: {shard: parts holding pointers}} for the given buckets: lane 0's from
        bucket_slots, the other lanes' from bucket_lanes (both read at once)."""
        chunks = chunked(buckets, 100)
        slot_reads = [self.db.execute_async(
            "SELECT bucket, shard, next_slot FROM {ks}.bucket_slots WHERE topic_uid = ? "
            "AND bucket IN ?", (topic_uid, chunk)) for chunk in chunks]
        lane_reads = [self.db.execute_async(
            "SELECT bucket, shard, part FROM {ks}.bucket_lanes WHERE topic_uid = ? "
            "AND bucket IN ?", (topic_uid, chunk)) for chunk in chunks]
        found: dict[int, dict[int, list[int]]] = {}
        for rows in self.db.results(slot_reads):
            for r in rows:
                found.setdefault(r["bucket"], {}).setdefault(r["shard"], []).extend(
                    range(parts_for(r["next_slot"], partition_cap)))
        for rows in self.db.results(lane_reads):
            for r in rows:
                found.setdefault(r["bucket"], {}).setdefault(r["shard"], []).append(r["part"])
        return found

    def record_lanes(self, topic_uid: uuid.UUID, parts: Sequence[tuple[int, int, int, int]]
                     ) -> list[Exception | None]:
        """Record (bucket, shard, part, ttl_s)s of lanes 1..1023 before pointers go into them
        (a reader finds a lane's partitions only through these rows). None where written."""
        outcomes = self.db.execute_many(
            "INSERT INTO {ks}.bucket_lanes (topic_uid, bucket, shard, part) VALUES (?, ?, ?, ?) "
            "USING TTL ?", [(topic_uid, b, s, part, ttl) for b, s, part, ttl in parts])
        return [None if ok else err for ok, err in outcomes]

    def count_writes(self, topic_uid: uuid.UUID, written: dict[tuple[int, int], int]
                     ) -> dict[tuple[int, int], Exception]:
        """Bump the write counts of (bucket, shard)s after their pointers are durable, and
        wait for them: the releasers' walk finds a pointer written behind its position only
        by its count, so a bump that failed (returned, by cell) must fail its pointers'
        write too."""
        cells = list(written)
        futures = [self.db.execute_async(
            "UPDATE {ks}.bucket_writes SET n = n + ? WHERE topic_uid = ? AND bucket = ? "
            "AND shard = ?", (written[(b, s)], topic_uid, b, s)) for b, s in cells]
        failed: dict[tuple[int, int], Exception] = {}
        for cell, future in zip(cells, futures, strict=True):
            try:
                future.result()
            except Exception as exc:  # reported per cell, as write_pointers does per pointer
                failed[cell] = exc
        return failed

    def write_counts(self, topic_uid: uuid.UUID, buckets: Sequence[int]
                     ) -> dict[tuple[int, int], int]:
        """{(bucket, shard): pointers written so far} of the given buckets."""
        return self.write_counts_in([([topic_uid], list(buckets))]).get(topic_uid, {})

    def write_counts_in(self, groups: Sequence[tuple[Sequence[uuid.UUID], Sequence[int]]]
                        ) -> dict[uuid.UUID, dict[tuple[int, int], int]]:
        """The write counts of each (topics, buckets) group, about a hundred topics x buckets
        a group: {topic: {(bucket, shard): n}}, a topic without counts absent, one in two
        groups with both's. The requests go out together: one round trip in all."""
        futures = [self.db.execute_async(
            "SELECT topic_uid, bucket, shard, n FROM {ks}.bucket_writes WHERE topic_uid IN ? "
            "AND bucket IN ?", (list(topic_uids), list(buckets)))
            for topic_uids, buckets in groups]
        counts: dict[uuid.UUID, dict[tuple[int, int], int]] = defaultdict(dict)
        for rows in self.db.results(futures):
            for r in rows:
                counts[r["topic_uid"]][(r["bucket"], r["shard"])] = r["n"]
        return dict(counts)

    def mark_active(self, topic_uid: uuid.UUID, buckets: Sequence[int], bucket_ms: int,
                    now_ms: int) -> None:
        """Record that these buckets hold pointers of the topic (idempotent): per topic, and
        per bucket (active_topics, with a TTL to the bucket's end plus a day)."""
        self._check(self.db.execute_many(
            "INSERT INTO {ks}.active_buckets (topic_uid, day, bucket) VALUES (?, ?, ?)",
            [(topic_uid, b * bucket_ms // MS_PER_DAY, b) for b in buckets]))
        self._check(self.db.execute_many(
            "INSERT INTO {ks}.active_topics (bucket, topic_uid) VALUES (?, ?) USING TTL ?",
            [(b, topic_uid, max(1, ((b + 1) * bucket_ms - now_ms) // 1000) + 86_400)
             for b in buckets]))

    def active_topics(self, buckets: Sequence[int]) -> set[uuid.UUID]:
        """Topics with any pointer in these buckets."""
        rows = self.db.execute(
            "SELECT topic_uid FROM {ks}.active_topics WHERE bucket IN ?", (list(buckets),))
        return {r["topic_uid"] for r in rows}

    def active_buckets(self, topic_uid: uuid.UUID, first: int, last: int,
                       bucket_ms: int) -> list[int]:
        """Buckets in [first, last] that hold any pointer, ascending."""
        return sorted(self.active_buckets_of([topic_uid], first, last, bucket_ms)
                      .get(topic_uid, []))

    def active_buckets_of(self, topic_uids: Sequence[uuid.UUID], first: int, last: int,
                          bucket_ms: int) -> dict[uuid.UUID, list[int]]:
        """active_buckets of many topics in one request ({topic: buckets in [first, last]},
        a topic without any absent); callers keep topics x days to about a hundred."""
        days = list(range(first * bucket_ms // MS_PER_DAY, last * bucket_ms // MS_PER_DAY + 1))
        rows = self.db.execute(
            "SELECT topic_uid, bucket FROM {ks}.active_buckets WHERE topic_uid IN ? AND day IN ? "
            "AND bucket >= ? AND bucket <= ?", (list(topic_uids), days, first, last))
        found: dict[uuid.UUID, list[int]] = defaultdict(list)
        for r in rows:
            found[r["topic_uid"]].append(r["bucket"])
        return dict(found)

    def write_pointers(
        self, topic_uid: uuid.UUID,
        placed: Sequence[tuple[int, int, int, Pointer, int]],
    ) -> list[Exception | None]:
        """Insert (bucket, shard, part, pointer, ttl_s) rows, one unlogged batch per partition
        (a batch of 1,000 sends to 16 shards is 16 round trips, not 1,000); None where
        written."""
        groups: dict[tuple[int, int, int], list[int]] = {}
        for index, (b, s, part, _, _) in enumerate(placed):
            groups.setdefault((b, s, part), []).append(index)
        chunks = [chunk for indexes in groups.values() for chunk in chunked(indexes, BATCH_ROWS)]
        outcomes = self.db.execute_batches(
            "INSERT INTO {ks}.timeline (topic_uid, bucket, shard, part, due_at, id, version, "
            "priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            [[(topic_uid, b, s, part, p.due_at_ms, p.id, p.version, p.priority, ttl)
              for b, s, part, p, ttl in (placed[i] for i in chunk)] for chunk in chunks])
        return item_errors(chunks, outcomes, len(placed))

    def pointers_of(self, topic_uid: uuid.UUID, plan: Sequence[tuple[int, int, int, int, int]],
                    page: int = FETCH_SIZE) -> Iterator[tuple[int, Iterator[Pointer]]]:
        """(index, pointers) of each (bucket, shard, part, from_ms, to_ms) of plan, in plan
        order. First pages are requested READ_AHEAD partitions ahead of the
        consumer, so a plan of many small partitions costs about one round trip, not one per
        partition. First pages hold `page` pointers (clamped to [MIN_PAGE, FETCH_SIZE]): a
        caller that stops after a few pointers should not make every partition read ahead
        send FETCH_SIZE of them; a partition that fills its first page goes on in pages of
        FETCH_SIZE."""
        page = min(FETCH_SIZE, max(MIN_PAGE, page))
        futures: dict[int, Any] = {}
        for index, entry in enumerate(plan):
            for ahead in range(index, min(len(plan), index + READ_AHEAD)):
                if ahead not in futures:
                    futures[ahead] = self._start_slice(topic_uid, plan[ahead], None, page)
            yield index, self._slice(topic_uid, entry, futures.pop(index))

    def _slice(self, topic_uid: uuid.UUID, entry: tuple[int, int, int, int, int],
               first: Any) -> Iterator[Pointer]:
        """The pointers of a slice whose first page `first` will bring; the rest, if any, in
        pages of FETCH_SIZE from where that page ended."""
        with translate_errors():
            rows = first.result()
        last = None
        for r in rows.current_rows:
            last = _pointer(r, entry[1], entry[2])
            yield last
        if rows.has_more_pages and last is not None:
            rest = self._start_slice(topic_uid, entry, (last.due_at_ms, last.id, last.version),
                                     FETCH_SIZE)
            yield from (_pointer(r, entry[1], entry[2]) for r in self.db.results_iter(rest))

    def _start_slice(self, topic_uid: uuid.UUID, entry: tuple[int, int, int, int, int],
                     after: PointerPosition | None, page: int) -> Any:
        b, s, part, lo, hi = entry
        if after is None:
            return self.db.execute_async(_SLICE_FROM_TIME, (
                topic_uid, b, s, part, lo, hi), page)
        due_ms, message_id, version = after
        return self.db.execute_async(_SLICE_AFTER, (
            topic_uid, b, s, part, due_ms, message_id, version, hi), page)

    def cursors(self, topic_uid: uuid.UUID) -> dict[int, int]:
        """{shard: through_ms}: every pointer of the shard due before through_ms is spent."""
        rows = self.db.execute(
            "SELECT shard, through FROM {ks}.cursors WHERE topic_uid = ?", (topic_uid,))
        return {r["shard"]: cql_ms(r["through"]) for r in rows}

    def cursors_of(self, topic_uids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[int, int]]:
        """cursors of many topics ({topic: {shard: through_ms}}, a topic without any absent):
        CURSOR_TOPICS topics a request, the requests sent together."""
        futures = [self.db.execute_async(
            "SELECT topic_uid, shard, through FROM {ks}.cursors WHERE topic_uid IN ?",
            (chunk,)) for chunk in chunked(topic_uids, CURSOR_TOPICS)]
        found: dict[uuid.UUID, dict[int, int]] = defaultdict(dict)
        for rows in self.db.results(futures):
            for r in rows:
                found[r["topic_uid"]][r["shard"]] = cql_ms(r["through"])
        return dict(found)

    def advance_cursors(self, topic_uid: uuid.UUID, positions: dict[int, int]) -> None:
        """Move cursors forward; a position behind the stored one loses (write timestamp).
        One request: the topic's cursors are one partition, so its moves are one batch (a
        pass of a quiet topic moves every shard's at once)."""
        self._check(self.db.execute_batches(
            "UPDATE {ks}.cursors USING TIMESTAMP ? SET through = ? WHERE topic_uid = ? "
            "AND shard = ?",
            [[(ms * 1000, ms, topic_uid, shard) for shard, ms in positions.items()]]))

    @staticmethod
    def _check(outcomes: list[tuple[bool, Any]]) -> None:
        for ok, result in outcomes:
            if not ok:
                raise StoreUnavailable(f"Cassandra unavailable: {type(result).__name__}")
