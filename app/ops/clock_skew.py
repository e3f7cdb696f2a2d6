"""How far this process's clock is from Cassandra's, and from each releaser's: never-early
delivery rests on every process's clock being within DUETIME_SAFETY_LAG_MS of the others',
and Cassandra's is the one they all can read.

Releasers publish their own skew (app.store.clocks); any process's gap to a releaser is its
own skew less that releaser's, each measured against Cassandra's to half a round trip."""

from __future__ import annotations

import logging

from app.ops import metrics
from app.services import Services

log = logging.getLogger("duetime.clock")


def measure_ms(services: Services) -> int:
    """This clock minus Cassandra's, in ms (positive: this one is ahead), taken at the middle
    of the shortest of a few round trips (app.ops.cluster_clock), so one slow round trip on
    a loaded host does not skew it. Sets duetime_clock_skew_seconds and logs a warning past
    half of the safety lag. Raises StoreUnavailable while Cassandra is down."""
    skew = services.cluster_clock.skew_ms()
    metrics.CLOCK_SKEW.set(skew / 1000)
    if abs(skew) > services.config.safety_lag_ms / 2:
        log.warning("this clock is %d ms %s Cassandra's (DUETIME_SAFETY_LAG_MS is %d): "
                    "run NTP/chrony", abs(skew), "ahead of" if skew > 0 else "behind",
                    services.config.safety_lag_ms)
    return skew


def releaser_gap_ms(services: Services, own_skew_ms: int, member: str | None = None) -> int | None:
    """The largest gap, in ms, between this clock and a live releaser's (other than
    `member`): positive when this clock is ahead. None when no other releaser reported in
    the last minute. Sets duetime_clock_releaser_gap_seconds and logs a warning past half
    of the safety lag."""
    others = {m: s for m, s in services.clocks.skews().items() if m != member}
    if not others:
        metrics.CLOCK_RELEASER_GAP.set(0)
        return None
    farthest, skew = max(others.items(), key=lambda item: abs(own_skew_ms - item[1]))
    gap = own_skew_ms - skew
    metrics.CLOCK_RELEASER_GAP.set(gap / 1000)
    if abs(gap) > services.config.safety_lag_ms / 2:
        log.warning("this clock is %d ms %s releaser %s's (DUETIME_SAFETY_LAG_MS is %d): "
                    "run NTP/chrony on both", abs(gap), "ahead of" if gap > 0 else "behind",
                    farthest, services.config.safety_lag_ms)
    return gap
