"""Pull leases served by the releasers that own the topic's shards (workers/broker.py, the
API side in app/desk.py): the call's want goes to the owner, which finds, takes and sends.
The lease path of the API process itself is made to fail, so what is handed out can only
have come from a broker."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from app import broker_wire, leasing
from app.config import Config
from tests.consumers import TopicClient, now_ms
from tests.releasing import releaser, tenant_of
from workers.releaser import Releaser

SLOTS = 4


@pytest.fixture()
def ring(config: Config, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Settings of a ring of release slots of this test's own, and the API process's own
    lease path made to fail."""
    def no_own_pass(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the API process read the timeline itself")

    monkeypatch.setattr(leasing, "_pass", no_own_pass)
    yield {"release_ring": 9000 + int(time.time() * 1000) % 1000, "release_slots": SLOTS}


def api(config: Config, settings: dict[str, Any]) -> Flask:
    from app import create_app

    return create_app(config.replace(**settings))


def wait_owned(*releasers: Releaser, within_s: float = 10) -> None:
    """Until the releasers hold every slot between them, each some (a rebalance)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        owned = [len(r.ownership.owned()) for r in releasers]
        if sum(owned) == SLOTS and all(owned):
            return
        time.sleep(0.05)
    raise AssertionError([sorted(r.ownership.owned()) for r in releasers])


def test_a_lease_is_served_by_the_owner_of_the_shards_never_early(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        with releaser(config, "b-owner", **ring) as r:
            wait_owned(r)
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
    finally:
        app.extensions["duetime"].close()


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


def test_what_a_second_owner_leased_after_the_call_left_goes_to_the_next_calls(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """Two owners each lease for the call; what the call cannot take is held by the process
    and handed to the next calls, or given back (scheduled, its attempt not counted)."""
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
            time.sleep(1.0)  # past the give-back of what the process held
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


def test_a_steady_consumer_of_one_message_at_a_time_is_served_mostly_from_what_is_held(
        config: Config, auth: dict[str, str], ring: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A want asks for what the process's calls asked for within the hold: the calls after
    it take what it brought, with no want of their own."""
    from app import desk

    sent: list[int] = []
    send = desk._Link.send

    def counted(link: desk._Link, want: Any, answer: Any) -> bool:
        sent.append(want.n)
        return send(link, want, answer)

    monkeypatch.setattr(desk._Link, "send", counted)
    app = api(config, ring)
    try:
        topic = TopicClient(app.test_client(), auth)
        ids = {r["id"] for r in topic.batch([{} for _ in range(100)])}
        with releaser(config, "b-steady", **ring) as r:
            wait_owned(r)
            got: list[str] = []
            calls = 0
            deadline = time.monotonic() + 30
            while len(got) < 100 and time.monotonic() < deadline:
                calls += 1
                for m in topic.lease(max_messages=1):
                    assert topic.ack(m) == 204
                    got.append(m["id"])
        assert sorted(got) == sorted(ids)  # each once
        assert len(sent) < calls / 2, (len(sent), calls, sent)
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
        services = app.extensions["duetime"]
        uid = services.topics.get(tenant_of(services, auth), topic.name).uid
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


def _answer_of(sock: socket.socket) -> bytes:
    """What the peer sent before it closed the connection (a reset counts as a close)."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""
