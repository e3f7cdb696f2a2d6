"""Per-tenant quotas: requests per second and enqueued messages per second, each with a
burst, shared by every API process of every host.

A tenant's allowance for one wall-clock second is its rate plus a credit: what the second
before left unused of its own allowance (as this process last knew that second's total), up
to the burst, or the whole burst after a second this process saw no use in. That is a token
bucket of the burst, refilled at the rate, counted in whole seconds. Each process counts
what it admits per tenant and second. Every SYNC_MS, for each tenant active in the current
second, a thread of its own writes this process's count (`quota_usage`, one row per process
and second) and reads the second's rows back, so the process knows what the others admitted
until then; the first request of a tenant in a second reads them at once (waiting at most
FIRST_READ_S, 50 ms: the only wait on the request path). A request is admitted while that,
plus this process's own count, stays within the allowance; past it the answer is 429 with
Retry-After (to the next second).

Precision: between two syncs each process decides alone, so all processes together may admit
up to what each admits in SYNC_MS (100 ms) beyond the allowance. If Cassandra cannot be
reached, each process goes on with what it last knew (requests are not refused for it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable

from app.errors import PayloadTooLarge, RateLimited
from app.store.quota_usage import QuotaUsageStore
from app.store.session import CassandraSession

SYNC_MS = 100
FIRST_READ_S = 0.05  # the longest a request waits to learn what the other processes admitted
log = logging.getLogger("duetime.quotas")


@dataclasses.dataclass(frozen=True)
class Limit:
    """At most per_s a second, plus up to burst of what the second before left unused."""

    per_s: float
    burst: int


@dataclasses.dataclass
class _Usage:
    """One tenant's use of one kind in one second."""

    second: int
    mine: int = 0  # admitted by this process
    others: int = 0  # admitted by the other processes, as last read
    allowance: float = 0.0


class Quotas:
    """Admits or refuses (RateLimited) per tenant, kind ("requests", "messages") and second.
    Thread-safe; one per process."""

    def __init__(self, db: CassandraSession, limits: dict[str, Limit],
                 clock: Callable[[], int]) -> None:
        self.limits = {kind: limit for kind, limit in limits.items() if limit.per_s > 0}
        self.clock = clock
        self.process = uuid.uuid4().hex
        self.store = QuotaUsageStore(db, self.process)
        self._usage: dict[tuple[str, str], _Usage] = {}
        # (allowance, all processes' total) of the seconds just past
        self._totals: dict[tuple[str, str, int], tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def admit(self, tenant: str, kind: str, count: int = 1) -> None:
        """Count `count` against the tenant's allowance of this second, or raise: 429 when
        over it (Retry-After: the next second), 413 when count is more than any second's
        allowance could hold."""
        limit = self.limits.get(kind)
        if limit is None:
            return
        if count > limit.per_s + limit.burst:
            raise PayloadTooLarge(f"{count} {kind} at once; this tenant's quota admits at most "
                                  f"{limit.per_s + limit.burst:g} in a second.")
        second = self.clock() // 1000
        with self._lock:
            known = self._usage.get((tenant, kind))
        others = None if known is not None and known.second == second else \
            self._read_others(tenant, kind, second)
        with self._lock:
            usage = self._current(tenant, kind, second, limit)
            usage.others = max(usage.others, others or 0)
            if usage.mine + usage.others + count > usage.allowance:
                raise RateLimited(
                    f"Over this tenant's quota of {limit.per_s:g} {kind} a second "
                    f"(burst {limit.burst}); retry after the second.",
                    retry_after_s=1)
            usage.mine += count
        self._start()

    def _read_others(self, tenant: str, kind: str, second: int) -> int | None:
        """What the other processes admitted for the tenant in this second so far, or None
        when Cassandra does not answer within FIRST_READ_S."""
        try:
            return self.store.others(tenant, kind, second, FIRST_READ_S)
        except Exception as exc:  # the quota goes on with what this process knows
            log.warning("quota read failed: %r", exc)
            return None

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _current(self, tenant: str, kind: str, second: int, limit: Limit) -> _Usage:
        key = (tenant, kind)
        usage = self._usage.get(key)
        if usage is not None and usage.second == second:
            return usage
        if usage is not None and usage.second == second - 1:
            self._totals[(tenant, kind, usage.second)] = (usage.allowance,
                                                          usage.mine + usage.others)
        before = self._totals.get((tenant, kind, second - 1))
        credit = limit.burst if before is None else min(limit.burst, max(0, before[0] - before[1]))
        usage = _Usage(second, allowance=limit.per_s + credit)
        self._usage[key] = usage
        return usage

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._sync_loop, name="quotas",
                                                    daemon=True)
                    self._thread.start()

    def _sync_loop(self) -> None:
        while not self._closed:
            self._wake.wait(SYNC_MS / 1000)
            try:
                self.sync()
            except Exception as exc:  # go on with what is known; retried next round
                log.warning("quota sync failed: %r", exc)

    def sync(self) -> None:
        """Write this process's counts of the current second and read every process's."""
        second = self.clock() // 1000
        with self._lock:
            active = [(key, u.second, u.mine) for key, u in self._usage.items()
                      if u.second == second]
            for old in [k for k in self._totals if k[2] < second - 1]:
                del self._totals[old]
        if not active:
            return
        others = self.store.publish([(tenant, kind, sec, mine)
                                     for (tenant, kind), sec, mine in active])
        with self._lock:
            for ((tenant, kind), sec, _), theirs in zip(active, others, strict=True):
                usage = self._usage.get((tenant, kind))
                if usage is not None and usage.second == sec:
                    usage.others = theirs
