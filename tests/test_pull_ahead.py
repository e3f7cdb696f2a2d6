"""Pull leases taken ahead (app.pull_ahead) on the real node: a long-polling call is handed a
message at its due time, from a lease taken before it; a cancel before the due time wins; a
message no call took is given back with its attempt not counted; a process that closes gives
back what it holds, and so does an API worker that gunicorn stops."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from flask import Flask

from app import create_app
from app.client import Client
from app.config import Config
from app.services import Services
from app.timeparse import format_ms, parse_instant
from tests.consumers import TopicClient, now_ms
from tests.serving import serving

EXIT_PORT = 18092


def _held(app: Flask) -> int:
    services: Services = app.extensions["duetime"]
    with services.held._changed:
        return sum(len(heap) for heap in services.held._held.values())


def _in_background(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        out["value"] = target()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _ahead(config: Config) -> Flask:
    """An API process that leases a whole second ahead (the default is 100 ms): room for a
    test to look at what it holds before the due time."""
    return create_app(config.replace(pull_ahead_ms=1000))


def test_a_waiting_call_gets_a_message_leased_before_its_due_time_at_that_time(
        config: Config, auth: dict[str, str]) -> None:
    app = _ahead(config)
    topic = TopicClient(app.test_client(), auth)
    due = now_ms() + 2000
    assert topic.enqueue(id="soon", deliver_at=format_ms(due)).status_code == 201
    waiting, out = _in_background(lambda: topic.lease(max_messages=1, wait_ms=5000))
    # leased ahead while the call waits: the row is leased, its message not handed out yet
    deadline = time.monotonic() + 3
    while topic.get("soon").get_json()["state"] != "leased" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert topic.get("soon").get_json()["state"] == "leased"
    assert now_ms() < due and waiting.is_alive()
    waiting.join()
    [message] = out["value"]  # TopicClient checks: not before deliver_at
    assert message["id"] == "soon" and message["attempt"] == 1
    assert parse_instant(message["deliver_at"]) == due
    assert topic.ack(message) == 204
    app.extensions["duetime"].close()


def test_a_waiting_call_has_as_many_leased_ahead_as_it_has_room_for_each_handed_at_its_time(
        config: Config, auth: dict[str, str]) -> None:
    """One consumer at a steady rate: everything due within the look-ahead is held for its
    call, not only the next message, so each of its next calls finds the next message
    already leased and is handed it at its due time, with no pass of its own."""
    app = _ahead(config)
    topic = TopicClient(app.test_client(), auth)
    first = now_ms() + 2000
    dues = {f"m{n}": first + n * 300 for n in range(3)}
    for name, due in dues.items():
        assert topic.enqueue(id=name, deliver_at=format_ms(due)).status_code == 201
    waiting, out = _in_background(lambda: topic.lease(max_messages=5, wait_ms=5000))
    deadline = time.monotonic() + 3
    while _held(app) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held(app) == 3 and now_ms() < first
    waiting.join()
    got = list(out["value"])
    while len(got) < 3:
        got += topic.lease(max_messages=5, wait_ms=2000)  # TopicClient: none early
    assert [m["id"] for m in got] == ["m0", "m1", "m2"]
    for m in got:
        assert m["attempt"] == 1 and m["received_at"] - dues[m["id"]] < 250, m
        assert topic.ack(m) == 204
    assert _held(app) == 0
    app.extensions["duetime"].close()


def test_a_cancel_before_the_due_time_wins_over_a_lease_taken_ahead(
        config: Config, auth: dict[str, str]) -> None:
    app = _ahead(config)
    topic = TopicClient(app.test_client(), auth)
    due = now_ms() + 2000
    for name in ("kept", "dropped"):
        assert topic.enqueue(id=name, deliver_at=format_ms(due)).status_code == 201
    # leased ahead as far as the waiting calls have room: two calls of one, both held
    calls = [_in_background(lambda: topic.lease(max_messages=1, wait_ms=4000))
             for _ in range(2)]
    deadline = time.monotonic() + 3
    while _held(app) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held(app) == 2 and now_ms() < due
    assert topic.client.delete(topic.url("/messages/dropped"),
                               headers=topic.headers).status_code == 204
    for waiting, _ in calls:
        waiting.join()
    assert sorted(m["id"] for _, out in calls for m in out["value"]) == ["kept"]
    assert topic.get("dropped").get_json()["state"] == "cancelled"
    assert topic.lease(max_messages=10, wait_ms=300) == []
    app.extensions["duetime"].close()


def _one_handed_one_held(app: Flask, auth: dict[str, str]) -> TopicClient:
    """A waiting call has "later" leased ahead for it, then gets "now" (due at once) from a
    pass and leaves with it: "later" is left held with nobody waiting."""
    topic = TopicClient(app.test_client(), auth)
    later = now_ms() + 900
    assert topic.enqueue(id="later", deliver_at=format_ms(later)).status_code == 201
    waiting, out = _in_background(lambda: topic.lease(max_messages=1, wait_ms=3000))
    deadline = time.monotonic() + 3
    while _held(app) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held(app) == 1
    assert topic.enqueue(id="now").status_code == 201
    waiting.join()
    assert [m["id"] for m in out["value"]] == ["now"]
    assert topic.ack(out["value"][0]) == 204
    assert _held(app) == 1 and now_ms() < later
    return topic


def _given_back(topic: TopicClient, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while topic.get("later").get_json()["state"] != "scheduled" and time.monotonic() < deadline:
        time.sleep(0.02)
    row: dict[str, Any] = topic.get("later").get_json()
    return row


def test_a_message_no_call_takes_is_given_back_its_attempt_not_counted(
        config: Config, auth: dict[str, str]) -> None:
    app = _ahead(config)
    topic = _one_handed_one_held(app, auth)
    row = _given_back(topic, within_s=3)
    assert row["state"] == "scheduled" and row["attempts"] == 0, row
    assert _held(app) == 0
    [again] = topic.lease(max_messages=1, wait_ms=2000)
    assert again["id"] == "later" and again["attempt"] == 1
    assert topic.ack(again) == 204
    app.extensions["duetime"].close()


def test_a_closing_process_gives_back_what_it_holds(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    other = _ahead(config)
    theirs = _one_handed_one_held(other, auth)
    other.extensions["duetime"].close()
    mine = TopicClient(app.test_client(), auth, name=theirs.name)
    row = _given_back(mine, within_s=0)
    assert row["state"] == "scheduled" and row["attempts"] == 0, row
    assert parse_instant(row["deliver_at"]) > now_ms()  # given back before its due time
    [message] = mine.lease(max_messages=1, wait_ms=3000)
    assert message["id"] == "later" and message["attempt"] == 1


def test_an_api_worker_that_stops_gives_back_what_it_holds(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    """gunicorn stopping a worker (a deploy, a restart, `HUP`) closes its services, so what
    it leased ahead for the next call of a consumer is scheduled again at once, not left
    leased until the lease ends a minute later."""
    name = f"exit{secrets.token_hex(3)}"
    # given back by the worker's close, not by the timer of a worker still running
    with serving(config.keyspace, EXIT_PORT, DUETIME_PULL_AHEAD_MS="1000",
                 DUETIME_PULL_GIVE_BACK_MS="60000") as base:
        api = Client(base, auth["Authorization"].split()[1])
        api.put_topic(name, lease_seconds=60)
        due = now_ms() + 2500
        api.enqueue(name, {"n": 1}, id="first", deliver_at=format_ms(due))
        api.enqueue(name, {"n": 2}, id="later", deliver_at=format_ms(due + 600))
        # both leased ahead for this call; it leaves with the first at its due time, and the
        # other stays held for the consumer's next call
        [message] = api.lease(name, max_messages=2, wait_ms=5000)
        assert message["id"] == "first"
        topic = TopicClient(app.test_client(), auth, name=name)
        assert topic.get("later").get_json()["state"] == "leased"
        api.close()  # no connection left open to keep the worker's graceful stop waiting
    row = topic.get("later").get_json()
    assert row["state"] == "scheduled" and row["attempts"] == 0, row
