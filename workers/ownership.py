"""Which release slots this releaser owns, kept by LWT leases on the slot rows.

tick() runs every lease_ms / RENEW_FRACTION: renew what is held (all at once), heartbeat,
give back slots above the fair share, claim free or expired slots below it (all at once).
A releaser that gives slots back (rebalance, stop) wakes the others ("slots", app.delivery.wakeups),
which claim at once (claim_share) instead of at their next tick: a slot nobody holds is a
slot whose due messages wait. For one tick after a rebalance hand-back the releaser that
gave a slot back may still take what it already holds there of webhook topics
(may_take): the new owner's first walk step comes after its claim, and the per-message
LWT decides between the two. A slot counts as owned only until
VALID_FRACTION of the lease has passed since the renewal was *sent* (monotonic clock), so a
releaser that cannot renew (partitioned, paused) stops acting on its slots before anyone may
claim them: a stale owner fences itself. Another releaser claims only after the row's expiry,
on its own clock; the gap (1 - VALID_FRACTION) x lease absorbs clock skew between hosts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.core.timeline import fair_share, stable_hash
from app.services import Clock
from app.store.ownership import OwnershipStore, SlotLease

RENEW_FRACTION = 3  # each renewal is one conditional batch for every slot held
VALID_FRACTION = 0.8
log = logging.getLogger("duetime.releaser")


class SlotOwnership:
    """Thread-safe view of the slots held, with the tick that keeps it."""

    def __init__(self, store: OwnershipStore, member: str, slots: int, lease_ms: int,
                 clock: Clock, wake_addr: str | None = None, broker_token: str | None = None,
                 on_gained: Callable[[], None] = lambda: None,
                 on_given_back: Callable[[], None] = lambda: None) -> None:
        """on_gained runs after slots are claimed: the steps that act on owned slots should
        look at once, not at their idle period. on_given_back runs after slots are handed
        back: the other releasers should claim them at once."""
        self.store = store
        self.on_gained = on_gained
        self.on_given_back = on_given_back
        self.wake_addr = wake_addr
        self.broker_token = broker_token
        self.member = member
        self.slots = slots
        self.lease_ms = lease_ms
        self.clock = clock
        self._held: dict[int, SlotLease] = {}
        self._valid_until: dict[int, float] = {}
        self._handed_back: dict[int, float] = {}  # slot -> until when (monotonic s)
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()  # one tick or claim_share at a time

    def owned(self) -> frozenset[int]:
        """Slots this releaser may act on right now."""
        now = time.monotonic()
        with self._lock:
            return frozenset(s for s, until in self._valid_until.items() if until > now)

    def may_take(self, slot: int) -> bool:
        """May this releaser lease a message of the slot for its POST: it holds the slot, or
        handed it back to a releaser that joined less than a tick ago (the messages it already
        had there are due before the new owner's first walk step may find them). Safe
        because a message is leased by an LWT on its version: one of the two takes it."""
        now = time.monotonic()
        with self._lock:
            return (self._valid_until.get(slot, 0.0) > now
                    or self._handed_back.get(slot, 0.0) > now)

    def _keep(self, lease: SlotLease, sent_at: float) -> None:
        with self._lock:
            self._handed_back.pop(lease.slot, None)
            self._held[lease.slot] = lease
            self._valid_until[lease.slot] = sent_at + self.lease_ms * VALID_FRACTION / 1000

    def _drop(self, slot: int, why: str) -> None:
        with self._lock:
            lease = self._held.pop(slot, None)
            self._valid_until.pop(slot, None)
        if lease is not None:
            log.info("slot %d dropped (%s) epoch=%d member=%s", slot, why, lease.epoch,
                     self.member)

    def tick(self) -> None:
        """One idempotent ownership step; errors leave held slots to their local validity."""
        with self._step_lock:
            self._renew()  # first: nothing may delay keeping what is held
            self.store.heartbeat(self.member, self.clock(), max(1, self.lease_ms // 1000),
                                 self.wake_addr, self.broker_token)
            with self._lock:
                held = sorted(self._held)
            target = fair_share(self.store.members(), self.member, self.slots)
            if len(held) > target:
                self._give_back(held[target:])
            elif len(held) < target:
                self._claim(target - len(held))

    def claim_share(self) -> None:
        """Claim what is free up to the fair share, now (another releaser gave slots back):
        two reads, and one conditional batch when there is something to claim."""
        with self._step_lock:
            with self._lock:
                held = len(self._held)
            target = fair_share(self.store.members(), self.member, self.slots)
            if held < target:
                self._claim(target - held)

    def _renew(self) -> None:
        with self._lock:
            leases = list(self._held.values())
        if not leases:
            return
        sent_at = time.monotonic()
        valid = self.owned()
        lapsed = [lease.slot for lease in leases if lease.slot not in valid]
        renewed = self.store.renew_all(leases, self.clock() + self.lease_ms)
        for lease, new in zip(leases, renewed, strict=True):
            if new is not None:
                self._keep(new, sent_at)
            else:
                self._drop(lease.slot, "renewal refused or unknown")
        # a slot whose validity had lapsed (renewals late: a busy host) is acted on again:
        # what its steps passed by meanwhile is looked at now, as after a claim
        if any(slot in self._held for slot in lapsed):
            self.on_gained()

    def _claim(self, wanted: int) -> None:
        rows = self.store.slots(self.slots)
        now = self.clock()
        free = [s for s in range(self.slots) if s not in self._held and (
            s not in rows or rows[s].expires_at_ms < now)]
        # start at a member-specific offset so joining releasers do not all race for slot 0
        start = stable_hash(self.member) % self.slots
        free.sort(key=lambda s: (s - start) % self.slots)
        if not free:
            return
        sent_at = time.monotonic()
        leases = self.store.claim_all([(rows.get(s), s) for s in free[:wanted]], self.member,
                                      now, now + self.lease_ms)
        if leases is None:  # another releaser took one of them first: slot by slot
            leases = []
            for slot in free:
                if len(leases) >= wanted:
                    break
                sent_at = time.monotonic()
                lease = self.store.claim(rows.get(slot), slot, self.member, now,
                                         now + self.lease_ms)
                if lease is not None:
                    self._keep(lease, sent_at)
                    leases.append(lease)
        else:
            for lease in leases:
                self._keep(lease, sent_at)
        for lease in leases:
            log.info("slot %d claimed epoch=%d member=%s", lease.slot, lease.epoch, self.member)
        if leases:
            self.on_gained()

    def _give_back(self, slots: list[int], why: str = "rebalance") -> None:
        with self._lock:
            leases = [self._held[s] for s in slots if s in self._held]
        for slot in slots:
            self._drop(slot, why)
        if why == "rebalance":
            now = time.monotonic()
            until = now + self.lease_ms / RENEW_FRACTION / 1000
            with self._lock:
                self._handed_back = {s: u for s, u in self._handed_back.items() if u > now}
                self._handed_back.update((lease.slot, until) for lease in leases)
        if leases:
            self.store.give_back_all(leases, self.clock())
            self.on_given_back()

    def release_all(self) -> None:
        """Graceful stop: leave the membership, then hand every slot back at once. In that
        order, the releasers woken by the hand-back count without this one and claim its
        share."""
        with self._step_lock:
            with self._lock:
                slots = sorted(self._held)
            try:
                self.store.leave(self.member)
            finally:
                self._give_back(slots, "stopping")
