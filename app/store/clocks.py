"""Releasers' clocks against Cassandra's (schema/019_process_clocks.cql): written by each
releaser with its measurement, read by every process to compare its clock with theirs."""

from __future__ import annotations

from app.store.session import CassandraSession

PART = 0  # every releaser of every ring: a handful of rows
TTL_S = 60


class ClockStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def report(self, member: str, skew_ms: int, now_ms: int) -> None:
        """This releaser's clock minus Cassandra's (ms), measured at now_ms; kept TTL_S."""
        self.db.execute(
            "INSERT INTO {ks}.process_clocks (part, member, skew_ms, measured_at) "
            "VALUES (?, ?, ?, ?) USING TTL ?", (PART, member, skew_ms, now_ms, TTL_S))

    def cassandra_now_ms(self) -> int:
        """Cassandra's clock (epoch ms), as the coordinator read it (one read)."""
        rows = self.db.execute("SELECT toUnixTimestamp(now()) AS now_ms FROM system.local")
        return int(rows[0]["now_ms"])

    def skews(self) -> dict[str, int]:
        """Each releaser's last skew (ms) of the last TTL_S seconds, by member."""
        rows = self.db.execute("SELECT member, skew_ms FROM {ks}.process_clocks WHERE part = ?",
                               (PART,))
        return {r["member"]: r["skew_ms"] for r in rows}

    def forget(self, member: str) -> None:
        """Drop a stopping releaser's report at once (its partition is tiny and rewritten
        every 10 s, so the tombstone costs nothing later)."""
        self.db.execute("DELETE FROM {ks}.process_clocks WHERE part = ? AND member = ?",
                        (PART, member))
