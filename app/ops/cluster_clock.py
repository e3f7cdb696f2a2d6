"""The cluster's time as this process reads it: its clock, corrected by its measured offset
to Cassandra's while the offset is past a tolerance (half the safety lag).

Never early and the walk's reads both rest on every process's clock being within the safety
lag of the others' (docs/design.md, "Times"). A writer whose clock is far behind would place
pointers the walk has passed; placement checks its writes against this time instead
(app.messages.placement), so such a host delivers its messages, late by nothing more than
its own write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

SAMPLES = 3
MEASURE_EVERY_MS = 60_000
RETRY_EVERY_MS = 5_000  # after a failed measurement (Cassandra down): the offset stays


class ClusterClock:
    """Thread-safe; one per process."""

    def __init__(self, clock: Callable[[], int], cassandra_now_ms: Callable[[], int],
                 tolerance_ms: int) -> None:
        self.clock = clock
        self._cassandra_now_ms = cassandra_now_ms
        self.tolerance_ms = tolerance_ms
        self._lock = threading.Lock()
        self._offset_ms = 0
        self._next_ms = -1  # the next measurement is due at this local time (epoch ms)

    def skew_ms(self) -> int:
        """This clock minus Cassandra's, in ms (positive: this one is ahead), at the middle of
        the shortest of SAMPLES round trips, so good to half of it. Raises StoreUnavailable
        while Cassandra is down."""
        best = min(self._round_trip() for _ in range(SAMPLES))
        self._set(best[1])
        return best[1]

    def now(self) -> int:
        """The cluster's time (epoch ms): this clock, less its skew while that is past the
        tolerance; measured at most every MEASURE_EVERY_MS, on the caller's thread."""
        now = self.clock()
        if now >= self._next_ms and self._lock.acquire(blocking=False):
            try:
                self._next_ms = now + RETRY_EVERY_MS
                self.skew_ms()
            except Exception:  # an unreachable Cassandra: the offset known stays
                pass
            finally:
                self._lock.release()
        return now + self._offset_ms

    def _set(self, skew_ms: int) -> None:
        self._offset_ms = -skew_ms if abs(skew_ms) > self.tolerance_ms else 0
        self._next_ms = self.clock() + MEASURE_EVERY_MS

    def _round_trip(self) -> tuple[int, int]:
        """(round trip, this clock at its middle minus Cassandra's), in ms."""
        before = self.clock()
        cassandra_ms = self._cassandra_now_ms()
        after = self.clock()
        return after - before, (before + after) // 2 - cassandra_ms
