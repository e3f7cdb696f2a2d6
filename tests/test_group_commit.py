"""Group commit of one-message enqueues and acks on the real node: concurrent requests for
one topic share writes, and each still gets the answer it would have had alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask

from app import group_commit
from app.errors import StoreUnavailable
from tests.consumers import TopicClient, now_ms
from tests.test_metrics import moved, scrape

CASSANDRA_REQUESTS = "duetime_cassandra_request_duration_seconds_count"


def _together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads of their own, released at the same moment."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_enqueues_share_writes_and_each_gets_its_answer(
        app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")

    def post(body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: app.test_client().post(url, headers=auth, json=body)

    before = scrape(app.test_client())
    for n in range(5):  # alone, one after another
        assert post({"payload": n})().status_code == 201
    alone = moved(before, scrape(app.test_client()), CASSANDRA_REQUESTS) / 5
    before = scrape(app.test_client())
    answers = _together([post({"payload": n}) for n in range(40)])
    together = moved(before, scrape(app.test_client()), CASSANDRA_REQUESTS) / 40
    assert [a.status_code for a in answers] == [201] * 40
    ids = [a.get_json()["id"] for a in answers]
    assert len(set(ids)) == 40
    for n, message_id in enumerate(ids):  # each request's own message, under its own id
        assert topic.get(message_id).get_json()["payload"] == n
    assert together < alone / 2, (together, alone)


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

    before = scrape(app.test_client())
    assert [ack(m)() for m in leased[:5]] == [204] * 5  # alone, one after another
    alone = moved(before, scrape(app.test_client()), CASSANDRA_REQUESTS) / 5
    before = scrape(app.test_client())
    rest = leased[5:]
    # each ack once, the first also twice more with its token and once with a wrong one
    codes = _together([ack(m) for m in rest] + [ack(rest[0]), ack(rest[0])] +
                      [ack(rest[1], token=rest[2]["lease"]["token"])])
    together = moved(before, scrape(app.test_client()), CASSANDRA_REQUESTS) / len(codes)
    assert codes[:42] == [204] * 42, codes
    assert codes[42] == 409, codes  # another message's token
    for m in rest:
        assert topic.get(m["id"]).get_json()["state"] == "delivered"
    # an ack alone is a conditional batch and a counter batch; grouped, the counters are one
    # batch a group and the conditional batches one per home of the group
    assert together < alone * 0.75, (together, alone)


def test_a_failed_shared_write_fails_each_member_and_the_next_runs(
        app: Flask, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")
    real = group_commit.enqueue
    first_running, release_first = threading.Event(), threading.Event()
    calls: list[int] = []

    def enqueue(services: Any, found: Any, items: list[Any]) -> Any:
        calls.append(len(items))
        if len(calls) == 1:  # hold the first write while the others queue behind it
            first_running.set()
            assert release_first.wait(10)
            return real(services, found, items)
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
    lone enqueue is that batch, its pointer and its counters, three requests (four before).
    All are due in one minute an hour ahead, where the warm-up batch has reserved every
    shard's slots (a reservation comes once per chunk) and no write is counted
    (bucket_writes counts only pointers due within seconds)."""
    topic = TopicClient(app.test_client(), auth)
    url = topic.url("/messages")
    due = (now_ms() // 60_000 + 60) * 60_000 + 30_000
    topic.batch([{"payload": n, "deliver_at": due} for n in range(64)])
    before = scrape(app.test_client())
    answers = [app.test_client().post(url, headers=auth, json={"payload": n, "deliver_at": due})
               for n in range(20)]
    each = moved(before, scrape(app.test_client()), CASSANDRA_REQUESTS) / 20
    assert [a.status_code for a in answers] == [201] * 20
    for n, answer in enumerate(answers):
        found = topic.get(answer.get_json()["id"]).get_json()
        assert (found["payload"], found["state"]) == (n, "scheduled")
    assert each < 3.5, each
