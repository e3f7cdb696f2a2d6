"""The releaser's beat: an idle releaser polls Cassandra at a few shared moments, not at
moments of each step's own.

A request that reaches an idle Cassandra node alone costs it about 5 ms of CPU, mostly in
waking and parking its request threads; a few that arrive back to back cost little more
than one (docs/benchmarks.md, Idle stack). So what an idle releaser costs the node is the
number of moments it polls at. Every safety-net poll therefore runs on one grid of
wall-clock time: multiples of the beat since the epoch, the same in every thread. A step
whose idle period is P runs at the last beat at most P after its previous run began (up to
one beat early, never late); a job that must run every period runs at every n-th beat, or
at equal divisions of the beat when it must run more often than the beat.
"""

from __future__ import annotations

import math
from datetime import datetime, tzinfo

from apscheduler.triggers.base import BaseTrigger

# A run that began this little after its beat still counts as on it (thread wake-up latency
# and clock reads): its next idle run is then a whole number of beats later.
SNAP_S = 0.05


class Beat:
    """A grid of wall-clock instants every period_ms (epoch multiples); times are epoch
    seconds of the host's clock (time.time())."""

    def __init__(self, period_ms: float) -> None:
        if period_ms <= 0:
            raise ValueError("a beat's period must be positive")
        self.period_s = period_ms / 1000

    def at_or_before(self, t: float) -> float:
        """The last beat at or before t (within SNAP_S after it counts as at it)."""
        return math.floor((t + SNAP_S) / self.period_s) * self.period_s

    def idle_until(self, began: float, idle_s: float, at_least_s: float) -> float:
        """When a step that began at `began` runs next without a wake-up: the last beat at
        most idle_s later, unless that is sooner than at_least_s after `began` (then
        began + idle_s, off the beat)."""
        aligned = self.at_or_before(began + idle_s)
        return aligned if aligned >= began + at_least_s else began + idle_s

    def every(self, ms: float) -> float:
        """A period on this grid close to ms: a whole number of beats at most ms (at
        least one), or below a beat the largest equal division of it at most ms."""
        beat_ms = self.period_s * 1000
        beats = ms / beat_ms + 1e-9  # a period of exactly n beats, less a rounding error
        if beats >= 1:
            return beat_ms * math.floor(beats)
        return beat_ms / math.ceil(beat_ms / ms - 1e-9)

    def trigger(self, every_ms: float) -> OnGrid:
        """An APScheduler trigger firing at the epoch multiples of every(every_ms)."""
        return OnGrid(self.every(every_ms))


class OnGrid(BaseTrigger):
    """Fires at the epoch multiples of every_ms: computed afresh each time, so the
    instants do not drift the way start + n x interval in microseconds would."""

    def __init__(self, every_ms: float) -> None:
        self.every_s = every_ms / 1000

    def get_next_fire_time(self, previous_fire_time: datetime | None,
                           now: datetime) -> datetime:
        after = now.timestamp() if previous_fire_time is None else max(
            now.timestamp(), previous_fire_time.timestamp() + self.every_s / 2)
        at = math.ceil(after / self.every_s) * self.every_s
        zone: tzinfo | None = now.tzinfo
        return datetime.fromtimestamp(at, tz=zone)

    def __str__(self) -> str:
        return f"every {self.every_s * 1000:g} ms on the epoch grid"
