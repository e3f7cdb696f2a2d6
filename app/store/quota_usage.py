"""What each API process admitted per tenant, kind and second (schema: `quota_usage`, one row
per process and second), for app.ops.quotas to share one allowance between processes."""

from __future__ import annotations

import threading
from typing import Any

from app.store.session import CassandraSession

_READ = ("SELECT process, n FROM {ks}.quota_usage WHERE tenant = ? AND kind = ? AND "
         "second = ?")
Usage = tuple[str, str, int, int]  # tenant, kind, second (epoch s), what this process admitted


class QuotaUsageStore:
    def __init__(self, db: CassandraSession, process: str) -> None:
        self.db = db
        self.process = process

    def others(self, tenant: str, kind: str, second: int, within_s: float) -> int | None:
        """What the other processes admitted for the tenant in this second so far, or None
        when Cassandra does not answer within within_s seconds (or refuses the read)."""
        done = threading.Event()
        found: list[list[dict[str, Any]]] = []

        def answered(rows: list[dict[str, Any]]) -> None:
            found.append(rows)
            done.set()

        future = self.db.execute_async(_READ, (tenant, kind, second))
        future.add_callbacks(answered, lambda exc: done.set())
        if not done.wait(within_s) or not found:
            return None
        return self._of_others(found[0])

    def publish(self, mine: list[Usage]) -> list[int]:
        """Write this process's counts, then read back per entry what the other processes
        admitted in the same tenant, kind and second (two rounds of parallel statements)."""
        self.db.results([self.db.execute_async(
            "INSERT INTO {ks}.quota_usage (tenant, kind, second, process, n) "
            "VALUES (?, ?, ?, ?, ?)", (tenant, kind, second, self.process, n))
            for tenant, kind, second, n in mine])
        rows = self.db.results([self.db.execute_async(_READ, (tenant, kind, second))
                                for tenant, kind, second, _ in mine])
        return [self._of_others(found) for found in rows]

    def _of_others(self, rows: list[dict[str, Any]]) -> int:
        return sum(r["n"] for r in rows if r["process"] != self.process)
