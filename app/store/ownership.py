"""Release-slot ownership rows (LWT only) and the releaser membership list (plain, TTL).

Guarantees:
- claim succeeds for one caller per epoch: on a free row (IF NOT EXISTS) or on a row whose
  lease has expired on the claimer's clock (IF epoch = the epoch it read AND expires_at < now);
- renew_all and give_back_all apply only for the (owner, epoch) that holds the row, so a stale owner
  can neither extend nor hand back an ownership that moved on;
- an LWT that times out has an unknown outcome: the caller treats the slot as not owned.
"""

from __future__ import annotations

import dataclasses

from app.errors import StoreUnavailable
from app.store.session import CassandraSession
from app.timeparse import cql_ms, from_ms


@dataclasses.dataclass(frozen=True)
class SlotLease:
    """Who holds a slot, under which epoch, until when (epoch ms, the holder's clock)."""

    slot: int
    owner: str | None
    epoch: int
    expires_at_ms: int


class OwnershipStore:
    """The slots and members of one ring (a pool of releasers)."""

    def __init__(self, db: CassandraSession, ring: int = 0) -> None:
        self.db = db
        self.ring = ring

    def slots(self, count: int) -> dict[int, SlotLease]:
        """The rows of slots 0..count-1 that exist."""
        futures = [self.db.execute_async(
            "SELECT slot, owner, epoch, expires_at FROM {ks}.release_slots WHERE ring = ? "
            "AND slot IN ?", (self.ring, list(range(i, min(i + 100, count)))))
            for i in range(0, count, 100)]
        return {r["slot"]: SlotLease(r["slot"], r["owner"], r["epoch"], cql_ms(r["expires_at"]))
                for rows in self.db.results(futures) for r in rows}

    def claim(self, current: SlotLease | None, slot: int, owner: str, now_ms: int,
              until_ms: int) -> SlotLease | None:
        """Take the slot if it is free or its lease expired; the new lease, or None."""
        try:
            if current is None:
                rows = self.db.execute(
                    "INSERT INTO {ks}.release_slots (ring, slot, owner, epoch, expires_at) "
                    "VALUES (?, ?, ?, 1, ?) IF NOT EXISTS",
                    (self.ring, slot, owner, from_ms(until_ms)))
                epoch = 1
            else:
                epoch = current.epoch + 1
                rows = self.db.execute(
                    "UPDATE {ks}.release_slots SET owner = ?, epoch = ?, expires_at = ? "
                    "WHERE ring = ? AND slot = ? IF epoch = ? AND expires_at < ?",
                    (owner, epoch, from_ms(until_ms), self.ring, slot, current.epoch,
                     from_ms(now_ms)))
        except StoreUnavailable:
            return None
        return SlotLease(slot, owner, epoch, until_ms) if rows[0]["[applied]"] else None

    def renew_all(self, leases: list[SlotLease], until_ms: int) -> list[SlotLease | None]:
        """Move the expiry of held leases to until_ms, all at once (a time in the past ends
        them); per lease the new one, or None when it is no longer ours (or the outcome is
        unknown)."""
        try:
            outcomes = self.db.execute_many(
                "UPDATE {ks}.release_slots SET expires_at = ? WHERE ring = ? AND slot = ? "
                "IF owner = ? AND epoch = ?",
                [(from_ms(until_ms), self.ring, lease.slot, lease.owner, lease.epoch)
                 for lease in leases])
        except StoreUnavailable:
            return [None] * len(leases)
        return [dataclasses.replace(lease, expires_at_ms=until_ms)
                if ok and result[0]["[applied]"] else None
                for lease, (ok, result) in zip(leases, outcomes, strict=True)]

    def give_back_all(self, leases: list[SlotLease], now_ms: int) -> None:
        """End held leases now so other releasers may claim the slots at once."""
        self.renew_all(leases, now_ms - 1)

    def heartbeat(self, member: str, now_ms: int, ttl_s: int) -> None:
        """Say this releaser is alive for ttl_s more seconds."""
        self.db.execute(
            "INSERT INTO {ks}.releaser_members (ring, member, seen_at) VALUES (?, ?, ?) "
            "USING TTL ?", (self.ring, member, from_ms(now_ms), ttl_s))

    def leave(self, member: str) -> None:
        """Drop this releaser from the membership at once (graceful stop). The row is in a
        tiny partition rewritten every few seconds, so this one delete costs nothing later."""
        self.db.execute("DELETE FROM {ks}.releaser_members WHERE ring = ? AND member = ?",
                        (self.ring, member))

    def members(self) -> list[str]:
        """Releasers whose heartbeat has not expired, sorted."""
        rows = self.db.execute(
            "SELECT member FROM {ks}.releaser_members WHERE ring = ?", (self.ring,))
        return sorted(r["member"] for r in rows)
