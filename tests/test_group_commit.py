"""Group commit of one-message enqueues and acks on the real node: concurrent requests for
one topic share writes, and each still gets the answer it would have had alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from cassandra.query import BoundStatement
from flask import Flask

from app.core import ids as id_module
from app.core.ids import home_of
from app.errors import StoreUnavailable
from app.messages import group_commit
from tests.consumers import TopicClient, now_ms


def _is_read(query: Any) -> bool:
    text = getattr(query, "query_string", None)
    if text is None and isinstance(query, BoundStatement):
        text = query.prepared_statement.query_string
    return isinstance(text, str) and text.lstrip().upper().startswith("SELECT")


class RequestsOfCalls:
    """Counts the Cassandra writes (every request but a SELECT) sent by the threads that ran
    calls through `run`: what group commit shares.

    The app's background work (its topic cache, pull wake-ups) and whatever else shares the
    test process's driver session send requests too, on threads of their own; counting the
    session's total moved the per-call figures by a fifth in one CI run. Reads are left out
    because a call reads its topic whenever the topic cache cannot vouch for its entry
    (app.topics.cache), which depends on timing. A group's shared write runs on the thread of
    its first member, one of the calls' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callers: set[int] = set()
        self.sent = 0

    def run(self, call: Callable[[], Any]) -> Callable[[], Any]:
        def counted() -> Any:
            with self._lock:
                self._callers.add(threading.get_ident())
            return call()
        return counted

    def on_request(self, future: Any) -> None:
        if threading.get_ident() in self._callers and not _is_read(future.query):
            with self._lock:
                self.sent += 1


@contextmanager
def requests_of_calls(app: Flask) -> Iterator[RequestsOfCalls]:
    counter = RequestsOfCalls()
    session = app.extensions["duetime"].db.session()
    session.add_request_init_listener(counter.on_request)
    try:
        yield counter
    finally:
        session.remove_request_init_listener(counter.on_request)


def _together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads of their own, released at the same moment."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _cached(app: Flask, topic: TopicClient, auth: dict[str, str]) -> None:
    """Look the topic up for 0.3 s, often enough that the process's topic cache follows the
    changes and serves it (app.topics.cache): calls that each read their topic first would
    reach the group commit spread over those reads, which is not what is measured here."""
    client = app.test_client()
    until = time.monotonic() + 0.3
    while time.monotonic() < until:
        client.get(topic.url("/messages/none"), headers=auth)
        time.sleep(0.02)


def test_concurrent_enqueues_share_writes_and_each_gets_its_answer(
        app: Flask, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(id_module, "SHARED_HOME_MS", 600_000)  # a slow machine's groups too
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")

    def post(body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: app.test_client().post(url, headers=auth, json=body)

    with requests_of_calls(app) as lone:
        for n in range(5):  # alone, one after another
            assert lone.run(post({"payload": n}))().status_code == 201
    alone = lone.sent / 5
    _cached(app, topic, auth)
    with requests_of_calls(app) as grouped:
        answers = _together([grouped.run(post({"payload": n})) for n in range(40)])
    together = grouped.sent / 40
    assert [a.status_code for a in answers] == [201] * 40
    ids = [a.get_json()["id"] for a in answers]
    assert len(set(ids)) == 40
    for n, message_id in enumerate(ids):  # each request's own message, under its own id
        assert topic.get(message_id).get_json()["payload"] == n
    assert together < alone / 2, (together, alone)
    # groups of one-message requests share the process's home, however many join a group
    assert len({home_of(i) for i in ids}) == 1


def test_one_id_sent_by_many_at_once_is_created_once(app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")
    same = _together([lambda: app.test_client().post(url, headers=auth, json={
        "id": "same", "payload": "x"}) for _ in range(10)])
    assert sorted(a.status_code for a in same) == [200] * 9 + [201]
    differing = _together([lambda n=n: app.test_client().post(url, headers=auth, json={
        "id": "differ", "payload": n}) for n in range(10)])
    codes = sorted(a.status_code for a in differing)
    assert codes == [201] + [409] * 9, codes
    winner = next(n for n, a in enumerate(differing) if a.status_code == 201)
    assert topic.get("differ").get_json()["payload"] == winner
    # bad input is answered before a request joins a group: it fails only itself
    mixed = _together([lambda n=n: app.test_client().post(url, headers=auth, json={
        "payload": n, "delay_ms": -5 if n == 3 else 0}) for n in range(8)])
    assert [a.status_code for a in mixed] == [201] * 3 + [400] + [201] * 4


def test_concurrent_acks_share_writes_and_each_gets_its_answer(
        app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    topic.batch([{"payload": n} for n in range(45)])
    leased = topic.lease(45)
    assert len(leased) == 45

    def ack(m: dict[str, Any], token: str | None = None) -> Callable[[], int]:
        return lambda: app.test_client().post(
            topic.url(f"/messages/{m['id']}/ack"), headers=auth,
            json={"lease_token": token or m["lease"]["token"]}).status_code

    with requests_of_calls(app) as lone:  # alone, one after another
        assert [lone.run(ack(m))() for m in leased[:5]] == [204] * 5
    alone = lone.sent / 5
    rest = leased[5:]
    _cached(app, topic, auth)
    # each ack once, the first also twice more with its token and once with a wrong one
    with requests_of_calls(app) as grouped:
        codes = _together([grouped.run(a) for a in [ack(m) for m in rest] + [
            ack(rest[0]), ack(rest[0]), ack(rest[1], token=rest[2]["lease"]["token"])]])
    together = grouped.sent / len(codes)
    assert codes[:42] == [204] * 42, codes
    assert codes[42] == 409, codes  # another message's token
    for m in rest:
        assert topic.get(m["id"]).get_json()["state"] == "delivered"
    # an ack alone is one conditional batch (its counters go through the process's ledger,
    # app.store.counts); grouped, the conditional batches are one per home of the group
    assert alone == 1, alone
    assert together < alone * 0.75, (together, alone)


def test_a_failed_shared_write_fails_each_member_and_the_next_runs(
        app: Flask, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")
    real = group_commit.enqueue
    first_running, release_first = threading.Event(), threading.Event()
    calls: list[int] = []

    def enqueue(services: Any, found: Any, items: list[Any], **options: Any) -> Any:
        calls.append(len(items))
        if len(calls) == 1:  # hold the first write while the others queue behind it
            first_running.set()
            assert release_first.wait(10)
            return real(services, found, items, **options)
        raise StoreUnavailable("Cassandra unavailable: test")

    monkeypatch.setattr(group_commit, "enqueue", enqueue)
    client = app.test_client()
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(client.post, url, headers=auth, json={"payload": "first"})
        assert first_running.wait(10)
        queued = [pool.submit(app.test_client().post, url, headers=auth,
                              json={"payload": n}) for n in range(5)]
        groups = app.extensions["duetime_groups"]["enqueue"]
        while groups.waiting() < 5:  # all five joined the next group
            threading.Event().wait(0.01)
        release_first.set()
        assert first.result().status_code == 201
        answers = [f.result() for f in queued]
    assert calls == [1, 5]  # the five shared one write
    assert [a.status_code for a in answers] == [503] * 5
    assert all(a.headers["Retry-After"] for a in answers)
    monkeypatch.setattr(group_commit, "enqueue", real)
    assert client.post(url, headers=auth, json={"payload": "after"}).status_code == 201



def test_a_lone_enqueue_writes_payload_and_state_in_one_round_trip(
        app: Flask, auth: dict[str, str]) -> None:
    """Without a campaign or a client id, a message's payload and state row are one batch: a
    lone enqueue is that batch and its pointer, two writes (its counters go through the
    process's ledger, app.store.counts).
    All are due in one minute an hour ahead, where the warm-up batch has reserved every
    shard's slots (a reservation comes once per chunk) and no write is counted
    (bucket_writes counts only pointers due within seconds)."""
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")
    due = (now_ms() // 60_000 + 60) * 60_000 + 30_000
    topic.batch([{"payload": n, "deliver_at": due} for n in range(64)])
    with requests_of_calls(app) as lone:
        answers = [lone.run(lambda n=n: app.test_client().post(
            url, headers=auth, json={"payload": n, "deliver_at": due}))() for n in range(20)]
    each = lone.sent / 20
    assert [a.status_code for a in answers] == [201] * 20
    for n, answer in enumerate(answers):
        found = topic.get(answer.get_json()["id"]).get_json()
        assert (found["payload"], found["state"]) == (n, "scheduled")
    assert each < 2.5, each
