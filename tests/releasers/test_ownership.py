"""Release-slot ownership on the real node: fencing of a stale owner, three releaser processes
sharing the slots, SIGKILL of one (its slots owned again, nothing lost, nothing early), SIGTERM
of one (slots handed back at once), slots handed back claimed at once by the others."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask.testing import FlaskClient

from app.config import Config
from app.services import Services, system_clock_ms
from app.store.ownership import OwnershipStore, SlotLease
from tests.campaign_helpers import topic_uid
from tests.conftest import ROOT
from tests.consumers import now_ms
from tests.receiver import Receiver, receiving
from tests.releasing import assert_on_time_and_signed, releaser, webhook_topic
from tests.waiting import wait_until
from workers.ownership import RENEW_FRACTION, VALID_FRACTION, SlotOwnership
from workers.releaser import STOP_RUNS_S

LEASE_MS = 2000
SLOTS = 64
_rings = itertools.count(1000 + os.getpid() % 1000 * 10)


def claim_free(store: OwnershipStore, slot: int, owner: str, until_ms: int) -> SlotLease:
    """Setup: the free slot claimed for owner. A claim whose outcome was unknown (an LWT that
    timed out on a node still warming up) is told apart by reading the row: applied after
    all, or claimed again."""
    for _ in range(5):
        lease = store.claim(None, slot, owner, system_clock_ms(), until_ms)
        found = lease or store.slots(slot + 1).get(slot)
        if found is not None and found.owner == owner:
            return found
        time.sleep(0.2)
    raise AssertionError(f"slot {slot} of a new ring could not be claimed")


def owners(store: OwnershipStore) -> dict[int, str]:
    """{slot: owner} of the slots whose lease has not expired."""
    now = system_clock_ms()
    return {s: lease.owner or "" for s, lease in store.slots(SLOTS).items()
            if lease.expires_at_ms > now}


def wait_owners(store: OwnershipStore, members: set[str], within_s: float) -> float:
    """Seconds until every slot is owned, only by `members`, each holding a fair share."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        held = owners(store)
        per_member = Counter(held.values())
        if (len(held) == SLOTS and set(per_member) == members
                and max(per_member.values()) - min(per_member.values()) <= 1):
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"slots not shared by {members}: {Counter(owners(store).values())}")


@contextmanager
def releaser_processes(config: Config, ring: int, names: list[str], lease_ms: int = LEASE_MS
                       ) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Releaser processes of one ring, stopped by SIGTERM at the end; when the test fails,
    the last lines each one logged are printed (pytest shows them with the failure)."""
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace, "DUETIME_RELEASE_RING": str(ring),
           "DUETIME_RELEASE_LEASE_MS": str(lease_ms), "DUETIME_RELEASE_SLOTS": str(SLOTS),
           "DUETIME_TOPIC_REFRESH_MS": "300"}
    with tempfile.TemporaryDirectory() as logs:
        paths = {n: os.path.join(logs, f"{n}.log") for n in names}
        procs = {}
        for n in names:
            with open(paths[n], "wb") as log:
                procs[n] = subprocess.Popen(
                    [sys.executable, "-m", "app.cli", "releaser", "--member", n],
                    cwd=ROOT, env=env, stderr=log)
        failed = True
        try:
            yield procs
            failed = False
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            if failed:  # stopped first, so that the logs end with how each stop went
                for n, path in paths.items():
                    with open(path, errors="replace") as log:
                        print(f"--- releaser {n}, its last lines:", *log.readlines()[-80:],
                              sep="")


def test_a_stale_owner_stops_acting_before_anyone_may_claim(services: Services) -> None:
    store = OwnershipStore(services.db, next(_rings))
    gained: list[str] = []  # a claim wakes the releaser's steps (on_gained)
    first = SlotOwnership(store, "first", 8, 1500, system_clock_ms,
                          on_gained=lambda: gained.append("first"))
    second = SlotOwnership(store, "second", 8, 1500, system_clock_ms,
                           on_gained=lambda: gained.append("second"))
    first.tick()
    assert first.owned() == frozenset(range(8))
    assert gained == ["first"]  # the free slots were claimed together
    # `first` stops renewing (paused, partitioned). `second` keeps trying to take over.
    deadline = time.monotonic() + 15
    while len(second.owned()) < 8 and time.monotonic() < deadline:
        second.tick()
        assert not (first.owned() & second.owned()), "two owners of a slot at once"
        time.sleep(0.05)
    assert first.owned() == frozenset()
    assert second.owned() == frozenset(range(8))
    # once per claim, not per tick: the leases ran out together, and were claimed together
    assert gained == ["first", "second"]
    # the stale owner's renewal is refused: it learns it lost the slots
    first.tick()
    assert first.owned() == frozenset()
    assert {lease.owner for lease in store.slots(8).values()} == {"second"}
    assert {lease.epoch for lease in store.slots(8).values()} == {2}


def test_slots_whose_validity_lapsed_and_came_back_are_looked_at_as_after_a_claim(
        services: Services) -> None:
    """Renewals late (a busy host) let a held slot's validity lapse: the steps pass its
    shards by meanwhile. The renewal that brings it back wakes them as a claim does."""
    store = OwnershipStore(services.db, next(_rings))
    gained: list[int] = []
    owner = SlotOwnership(store, "late", 4, 1500, system_clock_ms,
                          on_gained=lambda: gained.append(1))
    owner.tick()
    assert owner.owned() == frozenset(range(4)) and len(gained) == 1
    owner.tick()  # renewed in time: nothing regained
    assert len(gained) == 1
    time.sleep(1.5 * VALID_FRACTION + 0.1)  # no renewal within the validity
    assert owner.owned() == frozenset()
    owner.tick()  # nobody claimed meanwhile: the renewal keeps them
    assert owner.owned() == frozenset(range(4))
    assert len(gained) == 2


def test_one_conditional_batch_renews_every_slot_held_and_a_lost_one_is_told_apart(
        services: Services) -> None:
    store = OwnershipStore(services.db, next(_rings))
    now = system_clock_ms()
    leases = [claim_free(store, slot, "a", now + 60_000) for slot in range(32)]
    rounds: list[str] = []
    run_batches, execute_many = services.db.run_batches, services.db.execute_many

    def counting_batches(batches: Any, concurrency: int = 32) -> Any:
        rounds.extend(["batch"] * len(batches))
        return run_batches(batches, concurrency)

    def counting_each(cql: str, params: Any, concurrency: int = 64) -> Any:
        rounds.extend(["single"] * len(params))
        return execute_many(cql, params, concurrency)

    services.db.run_batches = counting_batches  # type: ignore[method-assign]
    services.db.execute_many = counting_each  # type: ignore[method-assign]
    try:
        renewed = store.renew_all(leases, now + 120_000)
        assert rounds == ["batch"] and all(r is not None for r in renewed)  # one Paxos round
        store.give_back_all([leases[5]], system_clock_ms())
        taken = store.claim(store.slots(32)[5], 5, "b", system_clock_ms(), now + 60_000)
        assert taken is not None and taken.epoch == 2
        rounds.clear()
        again = store.renew_all(leases, now + 180_000)
        assert rounds == ["batch"] + ["single"] * 32  # refused whole, then lease by lease
        assert [r is None for r in again] == [n == 5 for n in range(32)]
        assert store.slots(32)[5].owner == "b" and store.slots(32)[6].owner == "a"
    finally:
        del services.db.run_batches, services.db.execute_many


def test_free_slots_are_claimed_together_all_or_none(services: Services) -> None:
    store = OwnershipStore(services.db, next(_rings))
    now = system_clock_ms()
    first = store.claim_all([(None, 0), (None, 1)], "a", now, now + 60_000)
    assert first is not None and [(x.slot, x.epoch) for x in first] == [(0, 1), (1, 1)]
    store.give_back_all(first[:1], system_clock_ms())  # slot 0 is free again, slot 1 is not
    rows = store.slots(4)
    later = system_clock_ms()
    # slot 1 is held: a claim of 0, 1 and 2 together takes none of them
    assert store.claim_all([(rows[0], 0), (rows[1], 1), (None, 2)], "b", later,
                           later + 60_000) is None
    assert {s: (x.owner, x.epoch) for s, x in store.slots(4).items()} == {
        0: ("a", 1), 1: ("a", 1)}
    taken = store.claim_all([(rows[0], 0), (None, 2)], "b", later, later + 60_000)
    assert taken is not None and [(x.slot, x.epoch) for x in taken] == [(0, 2), (2, 1)]
    assert {s: (x.owner, x.epoch) for s, x in store.slots(4).items()} == {
        0: ("b", 2), 1: ("a", 1), 2: ("b", 1)}


def test_three_releasers_share_slots_and_survive_a_sigkill(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    ring = next(_rings)
    store = OwnershipStore(services.db, ring)
    with receiving(Receiver()) as target, \
            releaser_processes(config, ring, ["r1", "r2", "r3"]) as procs:
        wait_owners(store, {"r1", "r2", "r3"}, 30)
        topic, secret = webhook_topic(client, auth, target.url)
        client.put(topic.url(), json={"delivery": {"mode": "webhook", "url": target.url,
                                                   "timeout_seconds": 1}}, headers=auth)
        start = system_clock_ms() + 500
        sent = topic.batch([{"id": f"k{i}", "deliver_at": start + i * 20} for i in range(300)])
        assert {r["status"] for r in sent} == {201}
        time.sleep(2.0)
        procs["r1"].kill()
        killed = time.monotonic()
        wait_owners(store, {"r2", "r3"}, 15)
        reowned_s = time.monotonic() - killed
        # the dead owner's leases run out, then the next ownership tick (lease/3) claims them
        assert reowned_s <= LEASE_MS * (1 + 1 / RENEW_FRACTION) / 1000 + 0.5, reowned_s
        assert target.wait_for(lambda got: len({a.message_id for a in got}) == 300, 30)
    assert {a.message_id for a in target.arrivals} == {f"k{i}" for i in range(300)}
    assert_on_time_and_signed(target.arrivals, secret, topic.name)


def test_sigterm_hands_the_slots_back_at_once(config: Config, services: Services) -> None:
    ring = next(_rings)
    store = OwnershipStore(services.db, ring)
    lease_ms = 9000  # long enough that freed slots and expired ones are told apart
    with releaser_processes(config, ring, ["t1", "t2"], lease_ms) as procs:
        wait_owners(store, {"t1", "t2"}, 30)
        procs["t1"].send_signal(signal.SIGTERM)
        # its runs end within STOP_RUNS_S, a request under way on one of its threads within
        # the request timeout: how fast is the machine's; the slots' hand-back is timed below
        assert procs["t1"].wait(STOP_RUNS_S + config.request_timeout_s) == 0
        assert "t1" not in owners(store).values()
        assert "t1" not in store.members()
        taken_over_s = wait_owners(store, {"t2"}, 10)
        # faster than any lease of t1 could have run out (its last renewal came at most a
        # third of a lease before it stopped): the slots were free, not expiring
        assert taken_over_s < lease_ms * (1 - 1 / RENEW_FRACTION) / 1000, taken_over_s


def test_slots_handed_back_are_claimed_at_once_by_the_others(
        config: Config, services: Services) -> None:
    """A releaser that hands slots back, to one that joined or because it stops, wakes the
    others ("slots"), and they claim them at once: a slot nobody holds is one whose due
    messages wait. The releasers' own ownership ticks are removed here, so only the wake-up
    can make the claims."""
    ring = next(_rings)
    store = OwnershipStore(services.db, ring)
    settings = {"release_ring": ring, "release_slots": SLOTS, "release_lease_ms": 60_000}
    with releaser(config, "h1", **settings) as first:
        first.scheduler.remove_job("tick")
        wait_owners(store, {"h1"}, 10)
        with releaser(config, "h2", **settings) as second:
            second.scheduler.remove_job("tick")
            assert not second.ownership.owned()  # h1 held every slot when h2 started
            first.ownership.tick()  # h1 sees h2 and hands half back
            assert len(first.ownership.owned()) == SLOTS // 2
            wait_owners(store, {"h1", "h2"}, 3)
            # a releaser keeps what its claim won once the LWT's answer is back: the rows
            # can show the claim a moment before the claimer's own view does
            assert wait_until(lambda: len(second.ownership.owned()) == SLOTS // 2, 1)
        # h2 stopped: it left the membership, then handed its half back to h1
        wait_owners(store, {"h1"}, 3)
        assert wait_until(lambda: len(first.ownership.owned()) == SLOTS, 1)


def test_what_the_giver_held_for_slots_handed_back_is_still_delivered_on_time(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    """A releaser that hands slots back to one that joined still takes, for one tick, the
    messages of webhook topics it already held there: the new owner claims a moment later, but its
    first walk step may come after their due time. Here the joiner is a membership row
    with no releaser behind it, which never claims: what the giver dropped would wait until
    that row expired."""
    ring = next(_rings)
    store = OwnershipStore(services.db, ring)
    settings = {"release_ring": ring, "release_slots": SLOTS, "release_lease_ms": 60_000}
    with receiving(Receiver()) as target, releaser(config, "g1", **settings) as giver:
        giver.scheduler.remove_job("tick")
        wait_owners(store, {"g1"}, 10)
        topic, secret = webhook_topic(client, auth, target.url)
        due = now_ms() + 3000
        sent = topic.batch([{"id": f"h{n}", "deliver_at": due + 20 * n} for n in range(40)])
        assert {r["status"] for r in sent} == {201}
        uid = topic_uid(services, auth, topic.name)

        def held_for_topic() -> dict[str, int]:
            """{message id: slot} of this topic's messages the giver holds (it serves every
            topic of the keyspace, and earlier tests' leases come due in it too)."""
            slots = giver._slots_of(giver._topics[uid]) if uid in giver._topics else {}
            return {d.pointer.id: slots[d.pointer.shard] for d in giver.broker.held_of(uid)}

        assert wait_until(lambda: len(held_for_topic()) == 40, 2.5), held_for_topic()
        slot_of = held_for_topic()
        store.heartbeat("joined", system_clock_ms(), 60)
        giver.ownership.tick()  # it sees the new member and hands half its slots back
        handed_back = set(range(SLOTS)) - giver.ownership.owned()
        assert len(handed_back) == SLOTS // 2
        assert now_ms() < due - 500, "the hand-back came too late to test anything"
        theirs = {m for m, slot in slot_of.items() if slot in handed_back}
        assert theirs, slot_of  # 40 messages over 16 shards: some are in the half handed back
        # nobody owns the half handed back (the joiner never claims, the giver's tick job
        # is removed): only the giver's grace delivers those messages at all
        assert target.wait_for(lambda got: len({a.message_id for a in got}) == 40, 20)
        assert not handed_back & giver.ownership.owned()
    assert {a.message_id for a in target.arrivals} == {f"h{n}" for n in range(40)}
    assert_on_time_and_signed(target.arrivals, secret, topic.name)
    # how late a hand-over's messages come is a figure of the machine: make bench
