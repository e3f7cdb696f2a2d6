"""Pull consumption on the real node: one winner, expiry, extend, nack, dead, races, the pointer
behind the cursor, a hot second. Every lease is checked for early delivery (tests.consumers)."""

from __future__ import annotations

import collections
import random
import threading
import time
import uuid
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.config import Config
from app.core.ids import home_of
from app.core.timeline import COUNTED_AHEAD_MS
from app.core.timeparse import format_ms, parse_instant
from app.delivery.scan import pointer_key
from app.models import Pointer
from app.services import Services
from tests.consumers import TopicClient, now_ms
from tests.waiting import wait_until
from workers.releaser import Releaser


def _run_threads(count: int, target: Any) -> None:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def wrapped(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:  # surfaced below so a failing thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_twenty_consumers_race_each_message_leased_once(app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth, lease_seconds=60)
    ids = {r["id"] for r in topic.batch([{"payload": i} for i in range(200)])}
    leased: list[dict[str, Any]] = []
    lock = threading.Lock()

    def consume(_: int) -> None:
        mine = TopicClient(app.test_client(), auth, name=topic.name)
        for _ in range(15):
            got = mine.lease(10)
            with lock:
                leased.extend(got)

    _run_threads(20, consume)
    counts = collections.Counter(m["id"] for m in leased)
    assert set(counts) == ids
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]


def test_stale_token_ack_never_applies(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, lease_seconds=1)
    topic.enqueue(id="s1")
    [first] = topic.lease(wait_ms=2000)
    time.sleep(1.1)
    [second] = topic.lease(wait_ms=2000)
    assert second["id"] == "s1" and second["attempt"] == 2
    assert topic.ack(first) == 409
    assert topic.get("s1").get_json()["state"] == "leased"
    assert topic.ack(second) == 204
    assert topic.get("s1").get_json()["state"] == "delivered"
    assert topic.ack(second) == 204  # acking again with the winning token is a no-op
    bad = client.post(topic.url("/messages/s1/ack"), json={"lease_token": "junk"}, headers=auth)
    assert bad.status_code == 400


def test_an_ack_applies_only_to_the_lease_its_token_names(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """Acks go to Cassandra without a read when the token carries its version; the condition
    must still hold them to the lease: a forged token, an expired lease and a bare token
    (without the version) are answered as before."""
    topic = TopicClient(client, auth, lease_seconds=1)
    for name in ("t1", "t2", "t3"):
        topic.enqueue(id=name)
    got = {m["id"]: m for m in topic.lease(wait_ms=2000, max_messages=3)}
    assert set(got) == {"t1", "t2", "t3"}
    lease_uuid, _, version = got["t1"]["lease"]["token"].partition(".")
    forged = {"lease_token": f"{uuid.uuid4()}.{version}"}
    assert client.post(topic.url("/messages/t1/ack"), json=forged,
                       headers=auth).status_code == 409
    bare = {"lease_token": lease_uuid}
    assert client.post(topic.url("/messages/t1/ack"), json=bare, headers=auth).status_code == 204
    assert topic.get("t1").get_json()["state"] == "delivered"
    assert topic.ack(got["t2"]) == 204
    time.sleep(1.2)  # t3's lease runs out; nobody has leased it again yet
    assert topic.ack(got["t3"]) == 409
    assert topic.get("t3").get_json()["state"] != "delivered"


def test_an_ack_without_a_read_ends_no_later_than_the_rest_of_the_row(
        app: Flask, auth: dict[str, str]) -> None:
    """The ack sets only the columns it changes: their TTL must end no later than the TTL of
    the columns the lease wrote, and a row whose state columns are gone reads as missing."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=600)
    topic.enqueue(id="ttl1")
    [leased] = topic.lease(wait_ms=2000)
    assert topic.ack(leased) == 204
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    assert tenant is not None
    found = services.topics.get(tenant, topic.name)
    assert found is not None
    row = services.messages.get(found.uid, "ttl1")
    assert row is not None and row.state == "delivered"
    [ttls] = services.db.execute(
        "SELECT TTL(state) AS state, TTL(created_at) AS created FROM {ks}.message_states "
        "WHERE topic_uid = ? AND home = ? AND id = ?", (found.uid, home_of("ttl1"), "ttl1"))
    assert ttls["state"] <= ttls["created"], ttls
    assert ttls["created"] - ttls["state"] <= 5, ttls  # the 600 s lease is in both
    services.db.execute(
        "UPDATE {ks}.message_states SET state = null, version = null WHERE topic_uid = ? "
        "AND home = ? AND id = ?", (found.uid, home_of("ttl1"), "ttl1"))
    assert services.messages.get(found.uid, "ttl1") is None
    assert services.messages.get_many(found.uid, ["ttl1"]) == {}


def test_expired_lease_comes_due_again_and_extend_keeps_it(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, lease_seconds=1)
    topic.enqueue(id="e1")
    topic.enqueue(id="e2")
    got = {m["id"]: m for m in topic.lease(wait_ms=2000, max_messages=2)}
    assert set(got) == {"e1", "e2"}
    extended = client.post(topic.url("/messages/e2/extend"), headers=auth,
                           json={"lease_token": got["e2"]["lease"]["token"], "lease_seconds": 5})
    assert extended.status_code == 200
    assert extended.get_json()["lease"]["token"] == got["e2"]["lease"]["token"]
    again = topic.lease(wait_ms=3000, max_messages=2)
    assert [m["id"] for m in again] == ["e1"]
    assert again[0]["received_at"] >= parse_instant(got["e1"]["lease"]["expires_at"])
    assert topic.ack(again[0]) == 204
    assert topic.lease(wait_ms=1500) == []  # e2's extended lease still holds
    assert topic.ack(got["e2"]) == 204


def test_nack_with_delay_is_not_back_before_the_delay(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(id="n1")
    [m] = topic.lease(wait_ms=2000)
    nacked_at = now_ms()
    answer = client.post(topic.url("/messages/n1/nack"), headers=auth,
                         json={"lease_token": m["lease"]["token"], "delay_ms": 800,
                               "error": "busy"})
    assert answer.status_code == 204
    [back] = topic.lease(wait_ms=3000)
    assert back["id"] == "n1" and back["received_at"] >= nacked_at + 800
    assert topic.get("n1").get_json()["last_error"] == "busy"


def test_dead_after_max_attempts(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, max_attempts=2, retry={"backoff_seconds": 0.1})
    topic.enqueue(id="x1")
    for attempt in (1, 2):
        [m] = topic.lease(wait_ms=3000)
        assert m["attempt"] == attempt
        client.post(topic.url("/messages/x1/nack"), headers=auth,
                    json={"lease_token": m["lease"]["token"], "error": f"fail {attempt}"})
    assert topic.get("x1").get_json()["state"] == "dead"
    assert topic.get("x1").get_json()["last_error"] == "fail 2"
    assert topic.lease(wait_ms=500) == []


def test_cancel_racing_lease_ends_cancelled_or_delivered_never_both(
        app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    ids = [r["id"] for r in topic.batch([{"payload": i} for i in range(60)])]
    cancelled: set[str] = set()
    delivered: set[str] = set()

    def act(index: int) -> None:
        c = app.test_client()
        if index == 0:
            for i in ids:
                if c.delete(topic.url(f"/messages/{i}"), headers=auth).status_code == 204:
                    cancelled.add(i)
        else:
            mine = TopicClient(c, auth, name=topic.name)
            for _ in range(20):
                for m in mine.lease(5):
                    if mine.ack(m) == 204:
                        delivered.add(m["id"])

    _run_threads(4, act)
    assert not cancelled & delivered
    states = {i: topic.get(i).get_json()["state"] for i in ids}
    assert {i for i, s in states.items() if s == "delivered"} == delivered
    assert {i for i, s in states.items() if s == "cancelled"} == cancelled
    assert cancelled | delivered == set(ids)  # none lost


def test_reschedule_racing_lease_is_moved_or_refused(app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth, lease_seconds=60)
    ids = [r["id"] for r in topic.batch([{"payload": i} for i in range(40)])]
    moved: set[str] = set()
    leased: set[str] = set()
    later = now_ms() + 120_000

    def act(index: int) -> None:
        c = app.test_client()
        if index == 0:
            for i in ids:
                answer = c.patch(topic.url(f"/messages/{i}"), json={"deliver_at": later},
                                 headers=auth)
                if answer.status_code == 200:
                    moved.add(i)
                else:
                    assert answer.status_code == 409
        else:
            mine = TopicClient(c, auth, name=topic.name)
            for _ in range(10):
                leased.update(m["id"] for m in mine.lease(5))

    _run_threads(3, act)
    assert not moved & leased
    assert moved | leased == set(ids)
    for i in moved:
        body = topic.get(i).get_json()
        assert body["state"] == "scheduled" and body["deliver_at"] == format_ms(later)


def test_pointer_behind_the_walks_position_is_still_found(
        config: Config, auth: dict[str, str], app: Flask, suite_releaser: Releaser) -> None:
    """A pointer written behind where the owner's walk has read (a producer's clock a little
    behind) is found by its write count, at once, by the lease call that waits for it."""
    topic = TopicClient(app.test_client(), auth)
    began = now_ms()
    for _ in range(3):  # each call has the walk read the topic (workers.broker: read_now)
        topic.lease(wait_ms=600)
    services: Services = app.extensions["duetime"]
    found = services.topics.get(next(iter(tenant_of(services, auth))), topic.name)
    assert found is not None
    walk = suite_releaser._walks[found.uid]
    assert min(walk.position.values()) > began, "the walk should have read past now"
    past = topic.enqueue(id="past", deliver_at=format_ms(now_ms() - 3_600_000))
    assert past.status_code == 201
    # a producer whose clock runs 400 ms behind writes "due now" on its clock
    lagging = create_app(config, clock=lambda: now_ms() - 400)
    slow = TopicClient(lagging.test_client(), auth, name=topic.name)
    assert slow.enqueue(id="skewed").status_code == 201
    started = now_ms()
    got = {m["id"] for m in topic.lease(max_messages=10, wait_ms=2000)}
    got |= {m["id"] for m in topic.lease(max_messages=10, wait_ms=500)}
    assert got == {"past", "skewed"}
    assert now_ms() - started < 1500
    lagging.extensions["duetime"].close()


def tenant_of(services: Services, auth: dict[str, str]) -> set[str]:
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    return {tenant} if tenant else set()


def test_batch_ack_answers_each_item_like_the_single_ack(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.batch([{"id": f"a{i}"} for i in range(4)])
    leased = sorted(topic.lease(10, wait_ms=2000), key=lambda m: m["id"])
    assert [m["id"] for m in leased] == ["a0", "a1", "a2", "a3"]
    assert topic.ack(leased[3]) == 204
    acks = [{"id": m["id"], "lease_token": m["lease"]["token"]} for m in leased[:3]]
    acks += [{"id": "a3", "lease_token": leased[3]["lease"]["token"]},      # acked already
             {"id": "a0", "lease_token": leased[1]["lease"]["token"]},      # another's token
             {"id": "ghost", "lease_token": leased[0]["lease"]["token"]},   # no such message
             {"id": "a1", "lease_token": "not-a-token"},
             acks[2]]                                                       # given twice
    answer = client.post(topic.url("/acks"), json={"acks": acks}, headers=auth)
    assert answer.status_code == 200
    results = answer.get_json()["results"]
    statuses = [(r["id"], r["status"]) for r in results]
    assert statuses == [("a0", 204), ("a1", 204), ("a2", 204), ("a3", 204), ("a0", 409),
                        ("ghost", 404), ("a1", 400), ("a2", 204)]
    # each item's error is a whole problem+json body, as its single call would answer
    assert all(r["error"]["type"].startswith("https://") and r["error"]["status"] == r["status"]
               for r in results if r["status"] != 204), results
    assert all(topic.get(f"a{i}").get_json()["state"] == "delivered" for i in range(4))
    empty = client.post(topic.url("/acks"), json={"acks": []}, headers=auth)
    assert empty.status_code == 400 and empty.mimetype == "application/problem+json"


def test_only_pointers_due_soon_after_their_write_move_the_write_counts(
        services: Services) -> None:
    """bucket_writes tells releasers' walks what to re-read: a pointer due beyond
    COUNTED_AHEAD_MS (a lease's expiry, next month's schedule) must not move it."""
    topic = uuid.uuid4()
    now = now_ms()
    near, far = now + 2_000, now + COUNTED_AHEAD_MS + 60_000
    placed = services.placer.place(topic, [Pointer(near, "near", 1, 100, 0),
                                           Pointer(far, "far", 1, 100, 0)], now)
    assert placed == [None, None]
    bucket_ms = services.config.bucket_ms
    def counts() -> dict[tuple[int, int], int]:
        return services.timeline.write_counts(topic, sorted({near // bucket_ms, far // bucket_ms}))

    # the bumps are sent after the pointers are durable and not awaited (count_writes)
    assert wait_until(lambda: counts().get((near // bucket_ms, 0)) == 1, 2), counts()
    assert not wait_until(lambda: (far // bucket_ms, 0) in counts(), 0.5), counts()


def test_cursor_moves_are_one_request_and_only_go_forward(services: Services) -> None:
    """A pass over a quiet topic moves every shard's cursor: one batch for the topic's
    partition, in which a position behind the stored one still loses."""
    topic = uuid.uuid4()
    base = now_ms()
    services.timeline.advance_cursors(topic, {s: base + 1000 * s for s in range(16)})
    sent: list[object] = []
    session = services.db.session()
    session.add_request_init_listener(sent.append)
    try:
        services.timeline.advance_cursors(
            topic, {0: base + 5000, 1: base - 5000, 15: base + 20_000})
    finally:
        session.remove_request_init_listener(sent.append)
    assert len(sent) == 1
    stored = services.timeline.cursors(topic)
    assert stored[0] == base + 5000
    assert stored[1] == base + 1000  # the move back lost
    assert stored[15] == base + 20_000
    assert stored[7] == base + 7000


def test_a_lease_hands_out_the_earliest_due_whichever_shard_holds_them(
        client: FlaskClient, auth: dict[str, str]) -> None:
    # one message per request: each lands on a random shard of 16, so the due order runs
    # across shards, and a pass that read shard after shard up to its demand would hand out
    # the earliest of its first shards instead
    topic = TopicClient(client, auth)
    base = now_ms() + 2_000  # none due before all are written
    order = [f"m{n:02d}" for n in range(48)]
    for n in random.sample(range(48), 48):  # written out of due order too
        assert topic.enqueue(id=order[n], deliver_at=format_ms(base + 10 * n)).status_code == 201
    assert now_ms() < base  # (else a message written late is due at its write instead)
    time.sleep(max(0, base + 480 - now_ms()) / 1000)  # all due
    handed: list[str] = []
    for _ in range(12):
        leased = topic.lease(max_messages=4)
        assert {m["id"] for m in leased} == set(order[len(handed):len(handed) + 4])
        handed += [m["id"] for m in leased]
        for m in leased:
            assert topic.ack(m) == 204
    assert handed and sorted(handed) == order


def test_a_lease_whose_write_failed_is_found_by_the_next_call(
        app: Flask, auth: dict[str, str], monkeypatch: Any, suite_releaser: Releaser) -> None:
    """Found by `make faults` (a node restart): a pass whose lease pointer could not be
    written remembered the message's pointer as spent anyway, so no later pass of that process
    looked at it again and the cursor moved past it: the message was never delivered. The
    suite's releaser is the broker that takes the lease."""
    topic = TopicClient(app.test_client(), auth)
    assert topic.enqueue(id="failing").status_code == 201
    services = suite_releaser.services
    place = services.placer.place
    monkeypatch.setattr(services.placer, "place", lambda topic_uid, pointers, *args, **kwargs: [
        ConnectionError("node down")] * len(pointers))
    first = topic.lease(1, wait_ms=0)
    assert first == []  # its move could not be written: nothing handed out
    monkeypatch.setattr(services.placer, "place", place)
    again = topic.lease(1, wait_ms=0)
    assert [m["id"] for m in again] == ["failing"]


def test_a_give_back_whose_write_failed_leaves_the_lease_to_run_out(
        app: Flask, auth: dict[str, str], monkeypatch: Any) -> None:
    """What a releaser leased for a call that had gone is given back (scheduled again, due
    now). When that write fails (Cassandra unavailable), the message is still leased and its
    lease pointer (at the lease's expiry) is what brings it back: the giver must not take
    that pointer for spent. A give-back that applies does."""
    from app.delivery.broker_wire import Taken
    from app.delivery.leasing import give_back

    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=2)
    assert topic.enqueue(id="gone").status_code == 201
    assert [m["id"] for m in topic.lease(max_messages=1, wait_ms=5000)] == ["gone"]
    found = services.topics.get(next(iter(tenant_of(services, auth))), topic.name)
    assert found is not None
    row = services.messages.get(found.uid, "gone")
    assert row is not None and row.state == "leased"
    taken = Taken(0, None, row, b"{}", row.updated_at_ms)  # type: ignore[arg-type]
    key = pointer_key(found.uid, row.id, row.version)
    cas_many = services.messages.cas_many
    monkeypatch.setattr(services.messages, "cas_many",
                        lambda changes, before=None: [RuntimeError("WriteTimeout")] * len(changes))
    give_back(services, found, [taken])
    assert key not in services.scanner.spent
    assert services.messages.get(found.uid, "gone").state == "leased"  # type: ignore[union-attr]
    # its lease runs out: handed out again
    again = topic.lease(max_messages=1, wait_ms=8000)
    assert [m["id"] for m in again] == ["gone"] and again[0]["attempt"] == 2
    monkeypatch.setattr(services.messages, "cas_many", cas_many)
    row = services.messages.get(found.uid, "gone")
    assert row is not None and row.state == "leased"
    give_back(services, found, [Taken(1, None, row, b"{}", row.updated_at_ms)])  # type: ignore[arg-type]
    assert pointer_key(found.uid, row.id, row.version) in services.scanner.spent
    assert services.messages.get(found.uid, "gone").state == "scheduled"  # type: ignore[union-attr]
