"""Write counts (`bucket_writes`) of many topics read together, and whether they moved.

Every pointer written bumps the count of its (topic, bucket, shard) once it is durable
(app.store.timeline.TimelineStore.count_writes). A releaser that records a topic's counts
when it reads the topic's partitions whole knows, from the counts alone, whether anything was
written there since: a count that moved, or one it never recorded (workers.walk says what
counts cannot show, and how the walk covers it). Reading them topic by topic is a round trip
each; the walk reads about COUNT_CELLS (topic, bucket)s a request, the requests sent
together.

A pointer whose bump failed counts as not written (app.messages.placement: its write is
answered 503 and retried), so no accepted pointer is left to a count that never moved.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

COUNT_CELLS = 100  # (topic, bucket)s per bucket_writes read

Counts = dict[tuple[int, int], int]  # {(bucket, shard): pointers written}


class CountIndex(Protocol):
    """What the checks read (app.store.timeline.TimelineStore)."""

    def write_counts_in(self, groups: Sequence[tuple[Sequence[uuid.UUID], Sequence[int]]]
                        ) -> dict[uuid.UUID, Counts]: ...


def read_counts(index: CountIndex, wanted: Mapping[uuid.UUID, Sequence[int]]
                ) -> dict[uuid.UUID, Counts]:
    """The write counts of each topic's buckets ({topic: counts}, a topic without any absent),
    the requests sent together."""
    groups = count_groups(wanted)
    return index.write_counts_in(groups) if groups else {}


def count_groups(wanted: Mapping[uuid.UUID, Sequence[int]]
                 ) -> list[tuple[list[uuid.UUID], list[int]]]:
    """(topics, buckets) per read: topics with buckets, in order of their buckets, so that
    topics asking for the same ones share a read; each read at most about COUNT_CELLS
    (topic, bucket)s (a topic with more buckets than that reads alone)."""
    groups: list[tuple[list[uuid.UUID], list[int]]] = []
    group: list[uuid.UUID] = []
    buckets: set[int] = set()
    for uid in sorted((u for u, bs in wanted.items() if bs), key=lambda u: sorted(wanted[u])):
        grown = buckets | set(wanted[uid])
        if group and len(grown) * (len(group) + 1) > COUNT_CELLS:
            groups.append((group, sorted(buckets)))
            group, grown = [], set(wanted[uid])
        group.append(uid)
        buckets = grown
    if group:
        groups.append((group, sorted(buckets)))
    return groups
