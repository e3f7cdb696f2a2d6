"""Release-slot ownership rows (LWT only) and the releaser membership list (plain, TTL).

Guarantees:
- claim succeeds for one caller per epoch: on a free row (IF NOT EXISTS) or on a row whose
  lease has expired on the claimer's clock (IF epoch = the epoch it read AND expires_at < now);
  claim_all takes several such slots in one conditional batch, all or none;
- renew_all and give_back_all apply only for the (owner, epoch) that holds the row, so a
  stale owner can neither extend nor hand back an ownership that moved on; a releaser's
  renewal is one conditional batch (the ring is one partition), all or nothing, then lease
  by lease when one of them is no longer its own;
- an LWT that times out has an unknown outcome: the caller treats the slot as not owned.
"""

from __future__ import annotations

import dataclasses

from cassandra.query import UNSET_VALUE

from app.core.chunks import chunked
from app.core.timeparse import cql_ms
from app.errors import StoreUnavailable
from app.store.session import CassandraSession


@dataclasses.dataclass(frozen=True)
class SlotLease:
    """Who holds a slot, under which epoch, until when (epoch ms, the holder's clock)."""

    slot: int
    owner: str | None
    epoch: int
    expires_at_ms: int


_CLAIM_NEW = ("INSERT INTO {ks}.release_leases (ring, slot, owner, epoch, expires_at) "
              "VALUES (?, ?, ?, 1, ?) IF NOT EXISTS")
_CLAIM_EXPIRED = ("UPDATE {ks}.release_leases SET owner = ?, epoch = ?, expires_at = ? "
                  "WHERE ring = ? AND slot = ? IF epoch = ? AND expires_at < ?")
_RENEW = ("UPDATE {ks}.release_leases SET expires_at = ? WHERE ring = ? AND slot = ? "
          "IF owner = ? AND epoch = ?")
RENEW_BATCH = 100  # leases renewed by one conditional batch


class OwnershipStore:
    """The slots and members of one ring (a pool of releasers)."""

    def __init__(self, db: CassandraSession, ring: int = 0) -> None:
        self.db = db
        self.ring = ring

    def slots(self, count: int) -> dict[int, SlotLease]:
        """The rows of slots 0..count-1 that exist (one read: the ring's partition)."""
        rows = self.db.execute(
            "SELECT slot, owner, epoch, expires_at FROM {ks}.release_leases WHERE ring = ? "
            "AND slot < ?", (self.ring, count))
        return {r["slot"]: SlotLease(r["slot"], r["owner"], r["epoch"], cql_ms(r["expires_at"]))
                for r in rows}

    def claim(self, current: SlotLease | None, slot: int, owner: str, now_ms: int,
              until_ms: int) -> SlotLease | None:
        """Take the slot if it is free or its lease expired; the new lease, or None."""
        cql, params = self._claim_statement(current, slot, owner, now_ms, until_ms)
        try:
            rows = self.db.execute(cql, params)
        except StoreUnavailable:
            return None
        epoch = 1 if current is None else current.epoch + 1
        return SlotLease(slot, owner, epoch, until_ms) if rows[0]["[applied]"] else None

    def claim_all(self, wanted: list[tuple[SlotLease | None, int]], owner: str, now_ms: int,
                  until_ms: int) -> list[SlotLease] | None:
        """claim() of every (current row, slot) in one conditional batch (the ring is one
        partition: one Paxos round): all the new leases, or None when any slot was taken
        first (then none is taken) or the outcome is unknown."""
        if not wanted:
            return []
        batch = [self._claim_statement(current, slot, owner, now_ms, until_ms)
                 for current, slot in wanted]
        try:
            ((ok, rows),) = self.db.run_batches([batch])
        except StoreUnavailable:
            return None
        if not ok or not rows[0]["[applied]"]:
            return None
        return [SlotLease(slot, owner, 1 if current is None else current.epoch + 1, until_ms)
                for current, slot in wanted]

    def _claim_statement(self, current: SlotLease | None, slot: int, owner: str, now_ms: int,
                         until_ms: int) -> tuple[str, tuple[object, ...]]:
        if current is None:
            return _CLAIM_NEW, (self.ring, slot, owner, until_ms)
        return _CLAIM_EXPIRED, (owner, current.epoch + 1, until_ms, self.ring, slot,
                                current.epoch, now_ms)

    def renew_all(self, leases: list[SlotLease], until_ms: int) -> list[SlotLease | None]:
        """Move the expiry of held leases to until_ms (a time in the past ends them): one
        conditional batch per RENEW_BATCH leases (the ring is one partition: one Paxos
        round each). A batch refused as a whole (one lease is no longer ours) is retried
        lease by lease. Per lease the new one, or None when it is no longer ours (or the
        outcome is unknown)."""
        chunks = chunked(leases, RENEW_BATCH)
        params = [[(_RENEW, self._renew_params(lease, until_ms)) for lease in chunk]
                  for chunk in chunks]
        try:
            outcomes = self.db.run_batches(params)
            renewed: list[SlotLease | None] = []
            for chunk, (ok, rows) in zip(chunks, outcomes, strict=True):
                if ok and rows[0]["[applied]"]:
                    renewed += [dataclasses.replace(lease, expires_at_ms=until_ms)
                                for lease in chunk]
                else:
                    renewed += self._renew_each(chunk, until_ms)
            return renewed
        except StoreUnavailable:
            return [None] * len(leases)

    def _renew_each(self, leases: list[SlotLease], until_ms: int) -> list[SlotLease | None]:
        outcomes = self.db.execute_many(
            _RENEW, [self._renew_params(lease, until_ms) for lease in leases])
        return [dataclasses.replace(lease, expires_at_ms=until_ms)
                if ok and result[0]["[applied]"] else None
                for lease, (ok, result) in zip(leases, outcomes, strict=True)]

    def _renew_params(self, lease: SlotLease, until_ms: int) -> tuple[object, ...]:
        return (until_ms, self.ring, lease.slot, lease.owner, lease.epoch)

    def give_back_all(self, leases: list[SlotLease], now_ms: int) -> None:
        """End held leases now so other releasers may claim the slots at once."""
        self.renew_all(leases, now_ms - 1)

    def heartbeat(self, member: str, now_ms: int, ttl_s: int, wake_addr: str | None = None,
                  broker_token: str | None = None) -> None:
        """Say this releaser is alive for ttl_s more seconds, where it is woken, and what
        its pull broker asks a connection to present."""
        self.db.execute(
            "INSERT INTO {ks}.releaser_members (ring, member, seen_at, wake_addr, broker_token) "
            "VALUES (?, ?, ?, ?, ?) USING TTL ?",
            (self.ring, member, now_ms,
             UNSET_VALUE if wake_addr is None else wake_addr,
             UNSET_VALUE if broker_token is None else broker_token, ttl_s))

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

    def brokers(self) -> dict[str, tuple[str, str]]:
        """{member: ("host:port", token)} of every live releaser whose pull broker can be
        reached (workers/broker.py)."""
        rows = self.db.execute(
            "SELECT member, wake_addr, broker_token FROM {ks}.releaser_members WHERE ring = ?",
            (self.ring,))
        return {r["member"]: (r["wake_addr"], r["broker_token"]) for r in rows
                if r["wake_addr"] and r["broker_token"]}

    def wake_addresses(self) -> list[str]:
        """"host:port" of every live releaser that can be woken (app.delivery.wakeups)."""
        rows = self.db.execute(
            "SELECT wake_addr FROM {ks}.releaser_members WHERE ring = ?", (self.ring,))
        return [r["wake_addr"] for r in rows if r["wake_addr"]]
