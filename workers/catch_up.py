"""Which topics a sweep's catch-up must read, for many topics at once.

The catch-up (workers.releaser.Releaser._catch_up, app.delivery.scan.DueScanner.stragglers) looks
for pointers written behind a topic's cursors: it reads the topic's active buckets from the
catch-up's reach (DUETIME_RELEASE_CATCHUP_MS, an hour) before its lowest cursor up to its
highest, then their write counts, and reads partitions only where an owned count moved since
it last read them. Those first two reads, a round trip each per topic, were most of a sweep
of a crowded keyspace (400 awake topics caught up every 5 s). Here they are read for all the
topics together: one active_buckets read per CHUNK topics and one bucket_writes read per about
COUNT_CELLS (topic, bucket)s (workers.count_reads); only the topics with a moved count are
caught up one by one, from the counts read here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from app.core.chunks import chunked
from app.core.timeline import bucket_of
from app.delivery.scan import moved_counts
from workers.count_reads import CHUNK, Counts, Indexes, read_counts


@dataclasses.dataclass(frozen=True)
class Behind:
    """A topic due a catch-up: its owned shards' cursors ({shard: epoch ms}) and the write
    counts its last catch-up recorded ({(bucket, shard): n}; empty when its shards changed)."""

    uid: uuid.UUID
    cursors: dict[int, int]
    seen: Counts


def reach_ms(cursors: dict[int, int], catchup_ms: int) -> int:
    """Where a topic's catch-up looks from (epoch ms): catchup_ms before its lowest cursor."""
    return min(cursors.values()) - catchup_ms


def with_stragglers(timeline: Indexes, topics: Sequence[Behind], bucket_ms: int,
                    catchup_ms: int) -> dict[uuid.UUID, Counts]:
    """The topics with an owned write count behind their cursors (within catchup_ms before
    the lowest) that differs from the one recorded: those a straggler may have reached,
    each with the counts of its active buckets there as read now (its catch-up compares
    those and reads no index again: app.delivery.scan.DueScanner.stragglers)."""
    spans = {t.uid: (bucket_of(reach_ms(t.cursors, catchup_ms), bucket_ms),
                     bucket_of(max(t.cursors.values()), bucket_ms))
             for t in topics if t.cursors}
    spanned = [t for t in topics if t.uid in spans]
    active: dict[uuid.UUID, list[int]] = {}
    for chunk in chunked(spanned, CHUNK):
        found = timeline.active_buckets_of(
            [t.uid for t in chunk], min(spans[t.uid][0] for t in chunk),
            max(spans[t.uid][1] for t in chunk), bucket_ms)
        for t in chunk:
            first, last = spans[t.uid]
            active[t.uid] = [b for b in found.get(t.uid, []) if first <= b <= last]
    counts = read_counts(timeline, active)
    return {t.uid: counts.get(t.uid, {}) for t in spanned
            if moved_counts(t.seen, counts.get(t.uid, {}), t.cursors.keys())}
