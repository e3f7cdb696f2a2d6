"""The releaser's periodic re-check of topics its sweep found quiet, for many topics at once.

A quiet topic (workers.releaser: no pointer near now, not written to in the last minute, every
owned cursor caught up) is skipped by the sweep; a write or a pointer coming near now wakes it.
The re-check, every 2.5 to 5 minutes per topic, is the safety net for what those two indexes
can miss: a straggler whose `topic_writes` row was not recorded (app.messages.placement tolerates
that), a pointer whose `active_topics` row is gone. Sweeping each such topic in full read its
cursors,
its partitions and its write counts and moved its cursors: about 5 requests a topic, 200 a
second at 10,000 topics. Here the topics that came due for a re-check are checked together,
once a tenth of that period (workers.releaser.Releaser.sweep):

- one read of `active_buckets` per CHUNK topics, from the catch-up's reach
  (DUETIME_RELEASE_CATCHUP_MS, an hour) before the cursor the topic was found quiet at,
  through the end of the look-ahead: a bucket at or after that cursor's bucket holds
  pointers the sweep has not read since (the topic is swept in full);
- for the buckets before it, reads of `bucket_writes` sent together, about a hundred
  (topic, bucket)s each (workers.count_reads): a count of an owned shard that moved since the
  catch-up last read it is a straggler (swept in full).

A topic that passes both is quiet still, and its cursors stay where they were (a later
sweep or a consumer's pass reads from there: app.delivery.scan reads a long span through
`active_buckets`). Topics found quiet longer ago than MAX_SPAN_MS are swept in full, which
moves their cursors, so a re-check reads at most a few day partitions.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from app.core.chunks import chunked
from app.core.timeline import bucket_of
from app.delivery.scan import moved_counts
from workers.count_reads import CHUNK, Indexes, read_counts

MAX_SPAN_MS = 6 * 3_600_000  # quiet for longer: swept in full, which moves the cursors


@dataclasses.dataclass(frozen=True)
class QuietTopic:
    """A topic the sweep found quiet: the lowest of its owned cursors then (epoch ms), its
    owned shards, and the write counts its catch-up last read ({(bucket, shard): n})."""

    uid: uuid.UUID
    cursor_ms: int
    shards: frozenset[int]
    seen: dict[tuple[int, int], int]


def needs_sweep(topic: QuietTopic, active: Sequence[int],
                counts: dict[tuple[int, int], int], bucket_ms: int) -> bool:
    """Whether a quiet topic must be swept in full, given its active buckets in the re-check's
    span and the write counts of those before its cursor's bucket."""
    cursor_bucket = bucket_of(topic.cursor_ms, bucket_ms)
    if any(b >= cursor_bucket for b in active):
        return True
    return bool(moved_counts(
        topic.seen, {key: n for key, n in counts.items() if key[0] < cursor_bucket}, topic.shards))


def still_quiet(timeline: Indexes, topics: Sequence[QuietTopic], now_ms: int,
                bucket_ms: int, catchup_ms: int, lookahead_ms: int) -> set[uuid.UUID]:
    """The topics nothing has reached since they were found quiet (see the module's
    docstring); the others (and those quiet longer than MAX_SPAN_MS) need a full sweep."""
    last = bucket_of(now_ms + lookahead_ms, bucket_ms)
    fresh = [t for t in topics if t.cursor_ms >= now_ms - MAX_SPAN_MS]
    active: dict[uuid.UUID, list[int]] = {}
    for chunk in chunked(fresh, CHUNK):
        first = bucket_of(min(t.cursor_ms for t in chunk) - catchup_ms, bucket_ms)
        found = timeline.active_buckets_of([t.uid for t in chunk], first, last, bucket_ms)
        for t in chunk:
            since = bucket_of(t.cursor_ms - catchup_ms, bucket_ms)
            active[t.uid] = [b for b in found.get(t.uid, []) if b >= since]
    cursor_bucket = {t.uid: bucket_of(t.cursor_ms, bucket_ms) for t in fresh}
    behind = {t.uid: [b for b in active[t.uid] if b < cursor_bucket[t.uid]] for t in fresh
              if all(b < cursor_bucket[t.uid] for b in active[t.uid])}
    counts = read_counts(timeline, behind)
    return {t.uid for t in fresh if t.uid in behind
            and not needs_sweep(t, active[t.uid], counts.get(t.uid, {}), bucket_ms)}

