"""Which shards of a topic the lease calls of this process are scanning right now.

Concurrent lease calls of one process scan disjoint sets of shards, so they do not read the
same due pointers and then race (and contend in Paxos) for the same rows. Other processes are
not coordinated: between processes the per-row LWT decides, as it always does.
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator

STRIPES = 4  # a call claims about 1/STRIPES of a topic's shards


class ShardClaims:
    """Thread-safe; one per process."""

    def __init__(self) -> None:
        self._busy: defaultdict[uuid.UUID, set[int]] = defaultdict(set)
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def claim(self, topic_uid: uuid.UUID, shards: int, skip: set[int],
              wait: bool, stripe: bool = True) -> Iterator[set[int]]:
        """Claim up to ceil(shards / STRIPES) shards (every free one without stripe), not in
        `skip`, that nobody in this process is scanning, in a random order (so no shard
        starves). With wait, waits until one is free (unless every shard is in skip); without,
        the claim may be empty. Released on exit."""
        want = max(1, -(-shards // STRIPES)) if stripe else shards
        order = [s for s in random.sample(range(shards), shards) if s not in skip]
        with self._changed:
            while True:
                busy = self._busy[topic_uid]
                mine = set([s for s in order if s not in busy][:want])
                if mine or not wait or not order:
                    busy.update(mine)
                    break
                self._changed.wait()
        try:
            yield mine
        finally:
            with self._changed:
                self._busy[topic_uid].difference_update(mine)
                if not self._busy[topic_uid]:
                    del self._busy[topic_uid]
                self._changed.notify_all()
