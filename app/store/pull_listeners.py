"""The processes serving long polls that want to hear of pointers written (app.pull_wakes):
one partition per ring, a row per process, kept alive by its heartbeat (TTL)."""

from __future__ import annotations

from app.store.session import CassandraSession


class PullListenerStore:
    def __init__(self, db: CassandraSession, ring: int = 0) -> None:
        self.db = db
        self.ring = ring

    def register(self, address: str, ttl_s: int) -> None:
        """This process listens at `address` ("host:port") for ttl_s seconds from now."""
        self.db.execute("INSERT INTO {ks}.pull_listeners (ring, address) VALUES (?, ?) "
                        "USING TTL ?", (self.ring, address, ttl_s))

    def addresses(self) -> list[str]:
        """Every address registered and not expired."""
        rows = self.db.execute("SELECT address FROM {ks}.pull_listeners WHERE ring = ?",
                               (self.ring,))
        return [r["address"] for r in rows]
