"""Long polls of one process share their passes over a topic while nothing is due.

A pass that starts tells the other long polls of this process on the same topic that a pass
started within the next poll interval would find nothing more, unless this one finds
something: messages that come due meanwhile wait at most one poll interval, as they would for
the next pass of a single long poll. So idle consumers cost about one pass per topic and
interval in each process, not one per consumer (8 consumers polling an empty topic took 0.6 of
a core of Cassandra and 0.55 of the API workers without this).

Only repeated passes of a long poll are gated: every lease call makes at least one pass of
its own.
"""

from __future__ import annotations

import threading
import uuid

MAX_TOPICS = 10_000


class EmptyPasses:
    """When the latest pass over each topic that has not found anything started (epoch ms).
    Thread-safe."""

    def __init__(self) -> None:
        self._started: dict[uuid.UUID, int] = {}
        self._lock = threading.Lock()

    def begin(self, topic_uid: uuid.UUID, now_ms: int, interval_ms: int | None) -> bool:
        """Start a pass at now_ms, unless (with interval_ms) one started less than interval_ms
        ago has found nothing so far: then False, and the caller skips its pass."""
        with self._lock:
            started = self._started.get(topic_uid)
            if interval_ms is not None and started is not None and now_ms - started < interval_ms:
                return False
            if len(self._started) >= MAX_TOPICS:
                self._started.clear()
            self._started[topic_uid] = max(now_ms, started or now_ms)
            return True

    def found(self, topic_uid: uuid.UUID) -> None:
        """A pass found due messages: the next ones must not be skipped."""
        with self._lock:
            self._started.pop(topic_uid, None)
