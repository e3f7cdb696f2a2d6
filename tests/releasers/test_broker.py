"""Pull leases served by the releasers that own the topic's shards (workers/broker.py, the
API side in app/delivery/desk.py): the call's want goes to the owner, which finds, takes and sends.
The API process has no lease path of its own: what is handed out can only have come from a
broker."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask

from app.config import Config
from app.core.timeline import MS_PER_DAY
from app.core.timeparse import format_ms, parse_instant
from app.delivery import broker_wire, scan
from app.delivery import desk as desk_module
from app.services import Services
from tests.consumers import TopicClient, now_ms
from tests.releasing import releaser, tenant_of
from workers import broker as broker_module
from workers.broker import HELD_PER_LANE, Broker
from workers.releaser import Releaser, bind_listeners

SLOTS = 4


@pytest.fixture()
def ring() -> Iterator[dict[str, Any]]:
    """Settings of a ring of release slots of this test's own."""
    yield {"release_ring": 9000 + int(time.time() * 1000) % 1000, "release_slots": SLOTS}


def api(config: Config, settings: dict[str, Any]) -> Flask:
    from app import create_app

    return create_app(config.replace(**settings))


def topic_uid(app: Flask, auth: dict[str, str], topic: TopicClient) -> uuid.UUID:
    """The uid of a topic the test made through the app."""
    services = app.extensions["duetime"]
    return services.topics.get(tenant_of(services, auth), topic.name).uid


def wait_owned(*releasers: Releaser, within_s: float = 10) -> None:
    """Until the releasers hold every slot between them, each some (a rebalance)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        owned = [len(r.ownership.owned()) for r in releasers]
        if sum(owned) == SLOTS and all(owned):
            return
        time.sleep(0.05)
    raise AssertionError([sorted(r.ownership.owned()) for r in releasers])


@contextmanager
def _one_owner(config: Config, auth: dict[str, str], ring: dict[str, Any], member: str,
               topic_options: dict[str, Any] | None = None, **settings: Any
               ) -> Iterator[tuple[TopicClient, uuid.UUID, Releaser]]:
    """A new topic of an app on the test's ring, and one releaser, `member`, owning every
    slot of it (FAST, then `settings`): (topic, its uid, the releaser)."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth, **(topic_options or {}))
        uid = topic_uid(app, auth, topic)
        with releaser(config, member, **settings, **ring) as r:
            wait_owned(r)
            yield topic, uid, r
    finally:
        app.extensions["duetime"].close()


def test_a_lease_is_served_by_the_owner_of_the_shards_never_early(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    with _one_owner(config, auth, ring, "b-owner") as (topic, _uid, _r):
        sent = topic.batch([{"id": f"now{n}"} for n in range(5)])
        assert {s["status"] for s in sent} == {201}
        got = topic.lease(max_messages=10, wait_ms=2000)  # checks: never before due
        ids = {m["id"] for m in got}
        while len(ids) < 5:
            ids |= {m["id"] for m in topic.lease(max_messages=10, wait_ms=2000)}
        assert ids == {f"now{n}" for n in range(5)}
        # a long poll gets a message due later at its due time, never before
        due = now_ms() + 1500
        assert topic.enqueue(id="later", deliver_at=due).status_code == 201
        [later] = topic.lease(max_messages=1, wait_ms=5000)
        assert later["id"] == "later" and now_ms() >= due
        assert topic.ack(later) == 204
        # and one enqueued while it waits, at once
        waiting: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: waiting.update(
            got=topic.lease(max_messages=1, wait_ms=10_000)))
        caller.start()
        time.sleep(0.5)
        assert topic.enqueue(id="meanwhile").status_code == 201
        caller.join(15)
        assert [m["id"] for m in waiting["got"]] == ["meanwhile"]


def test_a_call_finds_a_releaser_started_a_moment_after_it_read_the_owners(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Unserved shards are a hand-over, answered empty, for twice the slot lease; past that
    503 `no-releaser`. The owners are read once a second, but a shard with no reachable
    owner has them read again within a short wait: a call 200 ms long, just after a
    releaser took the slots, is served rather than answered on a stale read of no owners."""
    app = api(config, {**ring, "release_lease_ms": 1000})  # hand-over grace: 2 s
    try:
        topic = TopicClient(app.test_client(), auth)
        assert topic.enqueue(id="waiting").status_code == 201
        assert topic.lease(max_messages=1, wait_ms=0) == []  # within the grace: empty
        time.sleep(2.1)
        unserved = topic.client.post(topic.url("/leases"), headers=auth,
                                     json={"max": 1, "wait_ms": 0})
        assert unserved.status_code == 503, unserved.get_json()
        assert unserved.get_json()["type"].endswith("/no-releaser")
        assert unserved.headers["Retry-After"]
        with releaser(config, "b-late", **ring) as r:
            wait_owned(r)
            [got] = topic.lease(max_messages=1, wait_ms=200)
            assert got["id"] == "waiting"
    finally:
        app.extensions["duetime"].close()


def test_shards_sharing_a_slot_have_their_owners_read_once_a_second(
        config: Config, auth: dict[str, str], ring: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot of the topic has its owner: calls read the owners once a second, not every
    50 ms as for a shard without one. 8 shards on 4 slots: some share a slot."""
    with _one_owner(config, auth, ring, "b-reads", topic_options={"shards": 8}) as (
            topic, _uid, _r):
        desk = topic.client.application.extensions["duetime"].desk
        reads: list[int] = []
        real = desk.ownership.slots

        def counted(count: int) -> Any:
            reads.append(count)
            return real(count)

        monkeypatch.setattr(desk.ownership, "slots", counted)
        began = time.monotonic()
        for _ in range(15):
            assert topic.lease(max_messages=1, wait_ms=0) == []
            time.sleep(0.02)
        # at least 0.3 s of calls: every 50 ms would be 6 reads or more
        once_a_second = 1 + int((time.monotonic() - began) / desk_module.OWNERS_EVERY_S)
        assert len(reads) <= once_a_second, (reads, time.monotonic() - began)


def test_a_long_polls_message_stays_scheduled_until_it_is_due_and_a_cancel_before_wins(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Nothing is taken ahead of a consumer: while a long poll waits, a message due later
    stays scheduled (attempt 0) until its due time, so a cancel 100 ms before it answers 204
    and the message never goes out; another, left alone, is handed out at its due time,
    never before, its lease running from the hand-out."""
    with _one_owner(config, auth, ring, "b-no-ahead") as (topic, _uid, _r):
        due = now_ms() + 1500
        for name in ("kept", "cancelled"):
            assert topic.enqueue(id=name, deliver_at=format_ms(due)).status_code == 201
        waiting: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: waiting.update(
            got=topic.lease(max_messages=10, wait_ms=4000, lease_seconds=30)))
        caller.start()
        while now_ms() < due - 100:
            for name in ("kept", "cancelled"):
                row = topic.get(name).get_json()
                assert (row["state"], row["attempts"]) == ("scheduled", 0), row
            time.sleep(0.02)
        cancel = topic.client.delete(topic.url("/messages/cancelled"), headers=topic.headers)
        assert cancel.status_code == 204, cancel.get_json()
        caller.join(15)
        [got] = waiting["got"]  # TopicClient.lease checks it came at or after deliver_at
        assert got["id"] == "kept" and got["received_at"] >= due
        # the lease began at the take, at or after the due time and before the answer came
        began = parse_instant(got["lease"]["expires_at"]) - 30_000
        assert due <= began <= got["received_at"], (due, began, got["received_at"])
        assert topic.ack(got) == 204
        assert topic.lease(max_messages=10, wait_ms=500) == []
        assert topic.get("cancelled").get_json()["state"] == "cancelled"


def test_consumers_taking_one_at_a_time_get_each_message_once(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        ids = [r["id"] for r in topic.batch([{} for _ in range(200)])]
        got: Counter[str] = Counter()
        lock = threading.Lock()
        stop = threading.Event()

        def consume() -> None:
            mine = TopicClient(app.test_client(), auth, name=topic.name)
            while not stop.is_set():
                for m in mine.lease(max_messages=1, wait_ms=500):
                    assert mine.ack(m) == 204  # one consumer at a time: its lease holds
                    with lock:
                        got[m["id"]] += 1

        with releaser(config, "b-one", **ring) as r:
            wait_owned(r)
            consumers = [threading.Thread(target=consume) for _ in range(8)]
            for c in consumers:
                c.start()
            deadline = time.monotonic() + 60
            while sum(got.values()) < 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            stop.set()
            for c in consumers:
                c.join(10)
        assert set(got) == set(ids) and max(got.values()) == 1
    finally:
        app.extensions["duetime"].close()


def test_a_shard_written_past_what_the_broker_holds_is_drained_one_at_a_time(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """More messages due now than the broker holds of a lane (HELD_PER_LANE), written one
    by one into one shard while its releaser walks it and nobody takes: those that land
    once the lane is full are read when consumers make room, and every one is handed out."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth, shards=1)
        count = HELD_PER_LANE * 2
        got: Counter[str] = Counter()
        with releaser(config, "b-full", **ring) as r:
            wait_owned(r)
            ids = [topic.enqueue().get_json()["id"] for _ in range(count)]
            time.sleep(1.5)  # the walk reads what landed; its lane is full
            deadline = time.monotonic() + 60
            while sum(got.values()) < count and time.monotonic() < deadline:
                for m in topic.lease(max_messages=1, wait_ms=500):
                    assert topic.ack(m) == 204
                    got[m["id"]] += 1
        assert set(got) == set(ids) and max(got.values()) == 1
    finally:
        app.extensions["duetime"].close()


def test_a_want_waiting_for_a_lease_to_end_is_served_when_it_ends_not_round_after_round(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A message held whose consumer's lease runs out in a second: a want that waits for it
    is checked again when the lease ends, not in a loop of empty rounds; it gets the message
    then, once."""
    with _one_owner(config, auth, ring, "b-lease-end") as (topic, _uid, r):
        topic.enqueue()
        first = topic.lease(max_messages=1, wait_ms=5000, lease_seconds=1)
        assert len(first) == 1
        before = r.broker.rounds
        again = topic.lease(max_messages=1, wait_ms=5000)
        assert [m["id"] for m in again] == [first[0]["id"]]
        assert again[0]["attempt"] == 2
        assert r.broker.rounds - before <= 10


def test_one_message_rounds_on_a_held_backlog_read_again_only_for_a_write_since(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Consumers taking one message at a time from a backlog the broker holds: a round
    hands out what is held without reading the topic's write counts first; a message this
    process writes just before its next call (another group, first by priority) is read
    first and handed out at once, not after the walk's next step. The walk's read of the
    backlog is made to have begun before this process noted its write (the due wake-up can
    outrun that note on a busy machine): the first round's counts, standing, stand for a
    read, and the rounds after it read none."""
    with _one_owner(config, auth, ring, "b-held", topic_options={"shards": 1}) as (topic, uid, r):
        sent = topic.batch([{"id": f"b{n}"} for n in range(300)])
        assert {s["status"] for s in sent} == {201}
        assert len(topic.lease(max_messages=1, wait_ms=2000)) == 1
        walk = r._walks[uid]
        with walk.lock:
            assert walk.read_at is not None
            walk.read_at -= 60_000
        timeline = r.services.timeline
        reads = Counter[str]()
        original = timeline.write_counts_in

        def counted(*args: Any, **kwargs: Any) -> Any:
            reads[threading.current_thread().name.split("_")[0]] += 1
            return original(*args, **kwargs)

        timeline.write_counts_in = counted  # type: ignore[method-assign]
        for _ in range(40):
            [m] = topic.lease(max_messages=1, wait_ms=2000)
            assert m["id"].startswith("b") and topic.ack(m) == 204
        assert reads["broker"] <= 2, reads
        assert topic.enqueue(id="urgent", priority=1, group="vip").status_code == 201
        [first] = topic.lease(max_messages=1, wait_ms=2000)
        assert first["id"] == "urgent"
        assert reads["broker"] <= 3, reads


def test_expired_last_attempts_are_made_dead_beside_what_a_round_hands_out(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A thousand last attempts whose leases ran out are made dead by the rounds, up to
    ROUND_MAX of them besides what each round hands out: a consumer asking for one message
    at a time gets the one due behind them within a few rounds, not one round per dead
    message; none of them is handed out again."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth, max_attempts=1, shards=1)
        count = 1000
        with releaser(config, "b-ending", **ring) as r:
            wait_owned(r)
            sent = topic.batch([{"id": f"once{n}"} for n in range(count)])
            assert {s["status"] for s in sent} == {201}
            leased = 0
            deadline = time.monotonic() + 90
            while leased < count and time.monotonic() < deadline:
                leased += len(topic.lease(max_messages=count - leased, wait_ms=1000,
                                          lease_seconds=1))
            assert leased == count
            time.sleep(1.5)  # every lease has run out: each may only be made dead
            assert topic.enqueue(id="behind").status_code == 201
            before = r.broker.rounds
            got: list[dict[str, Any]] = []
            while not got and time.monotonic() < deadline:
                got = topic.lease(max_messages=1, wait_ms=1000)
            assert [m["id"] for m in got] == ["behind"]
            assert r.broker.rounds - before < count // 4
            while _counts(topic)["dead"] < count and time.monotonic() < deadline:
                assert topic.lease(max_messages=1, wait_ms=500) == []
            assert _counts(topic)["dead"] == count
    finally:
        app.extensions["duetime"].close()


def _counts(topic: TopicClient) -> dict[str, int]:
    answer = topic.client.get(topic.url("/stats"), headers=topic.headers)
    assert answer.status_code == 200
    counts: dict[str, int] = answer.get_json()["counts"]
    return counts


def test_what_a_second_owner_leased_after_the_call_left_is_given_back(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Two owners each lease for the call; what the call cannot take is given back at once
    (scheduled, its attempt not counted)."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        ids = {r["id"] for r in topic.batch([{} for _ in range(40)])}
        with releaser(config, "b-first", **ring) as first, \
                releaser(config, "b-second", **ring) as second:
            wait_owned(first, second, within_s=20)
            got: Counter[str] = Counter()
            deadline = time.monotonic() + 30
            while set(got) != ids and time.monotonic() < deadline:
                for m in topic.lease(max_messages=3, wait_ms=500):
                    assert topic.ack(m) == 204
                    got[m["id"]] += 1
            assert set(got) == ids and max(got.values()) == 1
            # surplus not taken by a call is given back, not lost
            more = {r["id"] for r in topic.batch([{} for _ in range(10)])}
            first_call = topic.lease(max_messages=1, wait_ms=500)
            assert len(first_call) == 1
            time.sleep(0.5)  # the give-back runs after the call's answer
            rows = [topic.get(i).get_json() for i in more - {first_call[0]["id"]}]
            assert {row["state"] for row in rows} == {"scheduled"}
            assert {row["attempts"] for row in rows} == {0}
    finally:
        app.extensions["duetime"].close()


def test_a_long_poll_on_a_topic_made_a_moment_ago_waits_for_its_first_message(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """The owner may not know the topic yet when the want comes: the want waits while it
    learns it, rather than answering nothing at once."""
    app = api(config, ring)
    try:
        with releaser(config, "b-new", **ring) as r:
            wait_owned(r)
            topic = TopicClient(app.test_client(), auth)  # made now
            asked = time.monotonic()
            waiting: dict[str, Any] = {}
            caller = threading.Thread(target=lambda: waiting.update(
                got=topic.lease(max_messages=1, wait_ms=5000), at=time.monotonic()))
            caller.start()
            time.sleep(0.5)
            assert topic.enqueue(id="first").status_code == 201
            caller.join(10)
            assert [m["id"] for m in waiting["got"]] == ["first"]
            assert waiting["at"] - asked >= 0.5  # it waited for the message
    finally:
        app.extensions["duetime"].close()


def test_a_connection_without_the_releasers_token_is_closed_unanswered(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """The broker's port leases any topic's messages by uid: only a connection that opens
    with the token the releaser published in its membership row is served."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        assert topic.enqueue(id="kept").status_code == 201
        uid = topic_uid(app, auth, topic)
        with releaser(config, "b-token", **ring) as r:
            wait_owned(r)
            port = int(r.wakes.address.rpartition(":")[2])
            want = broker_wire.encode_want(broker_wire.Want(1, uid, 1, 30, None, 0))
            for hello in (b"", broker_wire.encode_hello("not-the-token")):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(hello + want)
                    assert _answer_of(sock) == b""  # closed, no answer
            # the API process, which read the token, is served
            [got] = topic.lease(max_messages=1, wait_ms=2000)
            assert got["id"] == "kept" and got["attempt"] == 1
    finally:
        app.extensions["duetime"].close()


def test_a_withdrawn_want_is_answered_at_once_and_takes_nothing(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A call answered by one owner withdraws its wants at the others: a withdrawn want is
    answered with nothing at once, and a message enqueued after is not leased for it."""
    with _one_owner(config, auth, ring, "b-withdraw") as (topic, uid, r):
        with _wanting(r, uid, 7) as sock:
            time.sleep(0.5)  # parked: nothing is due
            asked = time.monotonic()
            sock.sendall(broker_wire.encode_withdraw(7))
            reader = sock.makefile("rb")
            assert broker_wire.decode_got(broker_wire.decode_line(reader.readline())) \
                == (7, [])
            assert time.monotonic() - asked < 5  # at once, not at the want's 10 s
        assert topic.enqueue(id="after").status_code == 201
        [got] = topic.lease(max_messages=1, wait_ms=2000)
        assert got["id"] == "after" and got["attempt"] == 1


def test_a_want_other_owners_hold_too_is_taken_for_only_once_its_call_grants_it(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A want whose call asked other owners too: the owner holding a due message offers it
    (an *offer* line) and takes nothing until the call grants it; once granted it takes and
    answers. A granted owner that finds nothing (another call took it) passes the grant
    back. A want of a call with one owner is served without asking."""
    with _one_owner(config, auth, ring, "b-grant") as (topic, uid, r):
        with _wanting(r, uid, 9, several=True) as sock:
            reader = sock.makefile("rb")
            due = now_ms() + 500
            assert topic.enqueue(id="offered", deliver_at=format_ms(due)).status_code == 201
            assert broker_wire.decode_notice(broker_wire.decode_line(reader.readline()),
                                             "offer") == 9
            assert now_ms() >= due
            time.sleep(0.3)  # not granted: nothing taken
            assert topic.get("offered").get_json()["state"] == "scheduled"
            sock.sendall(broker_wire.encode_grant(9))
            want_id, taken = broker_wire.decode_got(broker_wire.decode_line(reader.readline()))
            assert want_id == 9 and [t.leased.id for t in taken] == ["offered"]
        with _wanting(r, uid, 10, several=True) as sock:
            reader = sock.makefile("rb")
            assert topic.enqueue(id="raced").status_code == 201
            assert broker_wire.decode_notice(broker_wire.decode_line(reader.readline()),
                                             "offer") == 10
            [other] = topic.lease(max_messages=1, wait_ms=2000)  # one owner: no offer
            assert other["id"] == "raced"
            sock.sendall(broker_wire.encode_grant(10))
            assert broker_wire.decode_notice(broker_wire.decode_line(reader.readline()),
                                             "pass") == 10


def test_a_call_asking_two_owners_takes_nothing_at_the_other_that_goes_back(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Two owners, messages due at one moment on the shards of both: a long poll gets its
    first owner's share at the due time, and nothing of the other owner's was taken for it
    and given back (those rows are still at their first version); the next calls get them."""
    app = api(config, ring)
    services: Services = app.extensions["duetime"]
    try:
        topic = TopicClient(app.test_client(), auth)
        uid = topic_uid(app, auth, topic)
        with releaser(config, "b-two-a", **ring) as a, releaser(config, "b-two-b", **ring) as b:
            wait_owned(a, b, within_s=20)
            due = now_ms() + 3000
            ids = {m["id"] for m in topic.batch([{"deliver_at": format_ms(due)}
                                                 for _ in range(16)])}
            got = topic.lease(max_messages=100, wait_ms=9000)
            assert got and all(parse_instant(m["deliver_at"]) == due for m in got)
            time.sleep(0.5)  # what a second owner would have taken comes back by then
            rest = ids - {m["id"] for m in got}
            assert rest  # 16 shards over both owners: each has some
            rows = services.messages.get_many(uid, sorted(rest))
            assert {(r.state, r.version) for r in rows.values()} <= {("scheduled", 1)}
            for m in got:
                assert topic.ack(m) == 204
            assert topic.drain(len(rest), within_s=20) == rest
    finally:
        services.close()


def test_a_call_two_owners_serve_from_a_backlog_is_taken_for_once(
        config: Config, auth: dict[str, str], ring: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two owners, both holding messages already due, and takes that last 600 ms (as on a
    loaded host): the call grants one owner, and nothing is taken at the other for it only
    to go back (those rows are still at their first version); the next calls get them."""
    take = broker_module.take_with_payloads

    def slow_take(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.6)
        return take(*args, **kwargs)

    app = api(config, ring)
    services: Services = app.extensions["duetime"]
    try:
        topic = TopicClient(app.test_client(), auth)
        uid = topic_uid(app, auth, topic)
        with releaser(config, "b-backlog-a", **ring) as a, \
                releaser(config, "b-backlog-b", **ring) as b:
            wait_owned(a, b, within_s=20)
            due = now_ms()
            ids = {m["id"] for m in topic.batch([{"deliver_at": format_ms(due)}
                                                 for _ in range(16)])}
            deadline = time.monotonic() + 10
            while sum(len(r.broker.held.get(uid, {})) for r in (a, b)) < len(ids):
                assert time.monotonic() < deadline, "the walks did not read the backlog"
                time.sleep(0.01)
            assert all(r.broker.held.get(uid) for r in (a, b))  # each owner holds some
            monkeypatch.setattr(broker_module, "take_with_payloads", slow_take)
            got = topic.lease(max_messages=100, wait_ms=2000)
            assert got
            time.sleep(1.0)  # what a second owner would have taken comes back by then
            rest = ids - {m["id"] for m in got}
            assert rest
            rows = services.messages.get_many(uid, sorted(rest))
            assert {(r.state, r.version) for r in rows.values()} <= {("scheduled", 1)}
            monkeypatch.setattr(broker_module, "take_with_payloads", take)
            for m in got:
                assert topic.ack(m) == 204
            assert topic.drain(len(rest), within_s=20) == rest
    finally:
        services.close()


def test_what_a_round_lets_go_of_for_shards_it_saw_unowned_is_read_again(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A round that sees fewer of a topic's shards owned than its walk reads (a slot's
    validity lapsed for a moment, its renewal late while a node restarts) lets go of what it
    held of the others. The walk reads those again: when the slots stay this releaser's,
    every message is still handed out once due, not left behind the walk's position."""
    with _one_owner(config, auth, ring, "b-lapse") as (topic, uid, r):
        due = now_ms() + 2500
        ids = {f"lapse{n}" for n in range(20)}
        sent = topic.batch([{"id": i, "deliver_at": format_ms(due)} for i in ids])
        assert {s["status"] for s in sent} == {201}
        while len(r.broker.held.get(uid, {})) < len(ids):
            assert now_ms() < due, "the walk did not read the messages ahead"
            time.sleep(0.01)
        owned = r.broker.shards_of
        r.broker.shards_of = lambda t: set(sorted(owned(t))[:1])
        assert topic.lease(max_messages=1, wait_ms=0) == []
        assert len(r.broker.held.get(uid, {})) < len(ids)  # it did let go of some
        r.broker.shards_of = owned
        got: set[str] = set()
        deadline = due + 10_000
        while got != ids and now_ms() < deadline:
            for m in topic.lease(max_messages=10, wait_ms=1000):
                assert topic.ack(m) == 204
                got.add(m["id"])
        assert got == ids, sorted(ids - got)


def test_an_answer_whose_connection_fails_gives_back_what_it_carried(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """An answer that cannot be sent (its API process's connection failed before the broker
    noticed it closed) gives its message back at once, its attempt not counted: the next
    call gets it within seconds, not when the 30 s lease taken for the want ends."""
    with _one_owner(config, auth, ring, "b-send-fails") as (topic, uid, r):
        with _wanting(r, uid, 9):
            def broken(line: bytes, unsent: Callable[[], object] | None = None) -> None:
                if unsent is not None:  # the connection failed: nothing is sent
                    unsent()

            while True:
                with r.broker._lock:
                    parked = r.broker._wants.get(uid)
                    if parked:
                        parked[0].reply = broken
                        break
                time.sleep(0.01)
            due = now_ms() + 300
            assert topic.enqueue(id="unsent", deliver_at=format_ms(due)).status_code == 201
            deadline = time.monotonic() + 10
            while r.services.messages.get(uid, "unsent").version < 2:  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "not taken for the want"
                time.sleep(0.01)
            [got] = topic.lease(max_messages=1, wait_ms=8000)
        assert got["id"] == "unsent" and got["attempt"] == 1 and got["received_at"] >= due


def test_a_number_taken_for_udp_is_passed_over_for_one_free_for_both(
        config: Config, services: Services) -> None:
    """Wants (TCP) and wake-ups (UDP) share the one published port number. With any free
    port asked for, a TCP number already taken for UDP is passed over, not served half."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        busy = taken.getsockname()[1]
        broker = Broker(services, "token", lambda uid: None, lambda topic: set(),
                        lambda uid: None, lambda topic, since: None,
                        lambda uid, pointers: None)
        first_bind = broker.bind
        tried: list[int] = []

        def bind(port: int) -> int:
            tried.append(first_bind(busy if not tried else port))
            return tried[-1]

        broker.bind = bind  # type: ignore[method-assign]
        wakes = bind_listeners(config.replace(wake_port=0), broker)
        try:
            port = int(wakes.address.rpartition(":")[2])
            assert tried[0] == busy and port == tried[-1] != busy
            broker.start()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # the broker listens on the wake-ups' number
        finally:
            broker.stop()
            wakes.close()


def test_a_releaser_whose_fixed_port_is_taken_does_not_start(
        config: Config, services: Services) -> None:
    """A releaser that could not serve its shards' pull topics must not own them: a taken
    DUETIME_WAKE_PORT fails its start instead of running without a broker."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = Services(config.replace(wake_port=port), services.clock)
        try:
            with pytest.raises(OSError):
                Releaser(taken, "b-taken")
        finally:
            taken.close()


@contextmanager
def _wanting(r: Releaser, topic_uid: Any, want_id: int,
             several: bool = False) -> Iterator[socket.socket]:
    """A connection to the releaser's broker, as an API process opens it (hello with its
    token), that has sent one want of 1 message waiting up to 10 s."""
    port = int(r.wakes.address.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(broker_wire.encode_hello(r.broker.token) + broker_wire.encode_want(
            broker_wire.Want(want_id, topic_uid, 1, 30, None, 10_000, several=several)))
        yield sock


def _answer_of(sock: socket.socket) -> bytes:
    """What the peer sent before it closed the connection (a reset counts as a close)."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _lease_two_days_on(config: Config, auth: dict[str, str], ring: dict[str, Any],
                       topic: str, calls: int) -> list[str]:
    """The ids `calls` lease calls get, in order, when the API and the releaser serving the
    topic run two days on."""
    def clock() -> int:
        return now_ms() + 2 * MS_PER_DAY

    from app import create_app

    later = create_app(config.replace(**ring), clock=clock)
    try:
        with releaser(config, "b-later", clock=clock, **ring) as r:
            wait_owned(r)
            consumer = TopicClient(later.test_client(), auth, name=topic, clock=clock)
            return [m["id"] for _ in range(calls)
                    for m in consumer.lease(max_messages=10, wait_ms=300)]
    finally:
        later.extensions["duetime"].close()


def test_a_backlog_older_than_a_day_is_still_leased(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Consumers back after two days find what came due while they were gone: a cursor that
    far behind is not moved past pointers no scan read."""
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        assert {r["status"] for r in topic.batch([{"id": f"old{i}"} for i in range(5)])} == {201}
        got = _lease_two_days_on(config, auth, ring, topic.name, 4)
        assert sorted(got) == [f"old{i}" for i in range(5)]
    finally:
        app.extensions["duetime"].close()


def test_a_backlog_over_more_buckets_than_a_scan_reads_is_leased_earliest_first(
        config: Config, auth: dict[str, str], ring: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan reads the earliest MAX_BUCKETS_PER_SCAN active buckets of a far-behind cursor's
    span, and the cursor stops where the unread ones begin."""
    monkeypatch.setattr(scan, "MAX_BUCKETS_PER_SCAN", 3)
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        start = now_ms()
        assert {r["status"] for r in topic.batch(
            [{"id": f"m{k}", "deliver_at": format_ms(start + k * config.bucket_ms)}
             for k in range(6)])} == {201}
        got = _lease_two_days_on(config, auth, ring, topic.name, 6)
        assert sorted(got) == [f"m{k}" for k in range(6)]
        assert set(got[:3]) == {"m0", "m1", "m2"}
    finally:
        app.extensions["duetime"].close()


def test_ten_thousand_at_one_second_all_delivered_partitions_capped(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Ten thousand messages due within one second, in partitions of at most 200 rows,
    leased by four consumers: each delivered, none before its time."""
    capped = {**ring, "partition_cap": 200}
    app = api(config, capped)
    services: Services = app.extensions["duetime"]
    try:
        topic = TopicClient(app.test_client(), auth, lease_seconds=120)
        second = (now_ms() // 1000 + 4) * 1000
        for start in range(0, 10_000, 1000):
            results = topic.batch([{"id": f"h{i}", "payload": i, "deliver_at": second + i % 1000}
                                   for i in range(start, start + 1000)])
            assert {r["status"] for r in results} == {201}
        found = services.topics.get(tenant_of(services, auth), topic.name)
        assert found is not None
        # pointers sit at max(deliver_at, enqueue time): the enqueue may run past `second`
        # a write that landed late (a busy machine) placed its pointer again, same version
        # (to the bucket of `second` at least: an enqueue done before it began wrote there)
        parts = [p for bucket in range(second // config.bucket_ms,
                                       max(now_ms(), second) // config.bucket_ms + 1)
                 for p in _partition_pointers(services, found.uid, bucket)]
        pointers = [key for p in parts for key in p]
        assert max(len(p) for p in parts) <= 200
        assert {i for i, _ in pointers} == {f"h{i}" for i in range(10_000)}
        assert {v for _, v in pointers} == {1}
        delivered: set[str] = set()
        lock = threading.Lock()

        # a bound for liveness, not for speed (that is `make bench`): the API, the releaser
        # and the consumers share this process's interpreter, on a machine perhaps busy
        deadline = time.monotonic() + 300

        def consume() -> None:
            mine = TopicClient(app.test_client(), auth, name=topic.name)
            while len(delivered) < 10_000 and time.monotonic() < deadline:
                acked = mine.ack_all(mine.lease(500, wait_ms=200))
                with lock:
                    delivered.update(acked)
            with lock:
                topic.received.extend(mine.received)

        with releaser(config, "b-capped", **capped) as r:
            wait_owned(r)
            consumers = [threading.Thread(target=consume) for _ in range(4)]
            for c in consumers:
                c.start()
            for c in consumers:
                c.join(330)
        assert len(delivered) == 10_000
        assert min(m["received_at"] for m in topic.received) >= second
    finally:
        services.close()


def _partition_pointers(services: Services, topic_uid: Any, bucket: int
                        ) -> list[list[tuple[str, int]]]:
    """The (id, version) of each pointer, partition by partition, of one bucket."""
    parts = services.timeline.parts(topic_uid, [bucket], 200).get(bucket, {})  # cap of the test
    found_parts = []
    for shard, found in parts.items():
        for part in found:
            rows = services.db.execute(
                "SELECT id, version FROM {ks}.timeline WHERE topic_uid = ? AND bucket = ? "
                "AND shard = ? AND part = ?", (topic_uid, bucket, shard, part))
            found_parts.append([(r["id"], r["version"]) for r in rows])
    return found_parts

