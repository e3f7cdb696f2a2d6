"""Enqueue, read, idempotency, cancel, reschedule, bad input, tenancy (real Cassandra)."""

from __future__ import annotations

import base64
import threading
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.core.timeparse import format_ms, parse_instant
from app.services import Services
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms


def test_enqueue_and_read_back(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    when = now_ms() + 60_000
    created = topic.enqueue(id="a1", deliver_at=format_ms(when), payload={"x": [1, 2]},
                            priority=7, campaign="xmas", headers={"k": "v"})
    assert created.status_code == 201
    assert created.get_json() == {"id": "a1", "deliver_at": format_ms(when), "state": "scheduled"}
    body = topic.get("a1").get_json()
    assert body["payload"] == {"x": [1, 2]} and body["priority"] == 7
    assert body["campaign"] == "xmas" and body["state"] == "scheduled"
    assert body["attempts"] == 0 and body["headers"] == {"k": "v"}


def test_epoch_ms_delay_and_binary_payload(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    when = now_ms() + 5000
    assert parse_instant(topic.enqueue(deliver_at=when).get_json()["deliver_at"]) == when
    before = now_ms()
    delayed = topic.enqueue(delay_ms=10_000).get_json()
    assert before + 10_000 <= parse_instant(delayed["deliver_at"]) <= now_ms() + 10_000
    raw = bytes(range(256))
    answer = topic.client.post(topic.url("/messages"), headers=auth,
                               json={"id": "bin", "payload_base64": base64.b64encode(raw).decode()})
    assert answer.status_code == 201
    assert base64.b64decode(topic.get("bin").get_json()["payload_base64"]) == raw


def test_local_time_in_recipient_zone(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    answer = topic.enqueue(local_time="2027-03-28T03:30:00", timezone="Europe/Bucharest")
    assert answer.status_code == 201
    # 03:30 does not exist that night (03:00 → 04:00): moved forward to 04:30 EEST = 01:30Z
    assert answer.get_json()["deliver_at"] == "2027-03-28T01:30:00.000Z"


def test_server_ids_are_unique_and_time_ordered(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    ids = [r["id"] for r in topic.batch([{"payload": i} for i in range(50)])]
    assert len(set(ids)) == 50


def test_idempotent_retry_and_conflict(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    first = topic.enqueue(id="same", delay_ms=60_000, payload="p")
    again = topic.enqueue(id="same", delay_ms=60_000, payload="p")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.get_json() == again.get_json()
    other = topic.enqueue(id="same", delay_ms=60_000, payload="q")
    assert other.status_code == 409
    assert other.content_type == "application/problem+json"
    assert topic.get("same").get_json()["payload"] == "p"
    # empty headers or labels are none: a retry may spell them either way (GET shows {})
    assert topic.enqueue(id="bare", delay_ms=60_000, headers={}, labels={}).status_code == 201
    assert topic.enqueue(id="bare", delay_ms=60_000).status_code == 200
    assert topic.enqueue(id="bare", delay_ms=60_000, labels={"a": "b"}).status_code == 409


def test_concurrent_retries_of_one_id_make_one_message(
        app: Flask, auth: dict[str, str], services: Services) -> None:
    topic = TopicClient(app.test_client(), auth)
    statuses: list[int] = []
    barrier = threading.Barrier(20)

    def retry() -> None:
        c = app.test_client()
        barrier.wait()
        statuses.append(c.post(topic.url("/messages"), headers=auth,
                               json={"id": "race", "payload": 1, "delay_ms": 60_000}).status_code)

    threads = [threading.Thread(target=retry) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] * 19 + [201]
    stats = topic.client.get(topic.url("/stats"), headers=auth).get_json()
    assert stats["counts"]["scheduled"] == 1


def test_batch_results_in_order_one_bad_item_fails_no_other(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    results = topic.batch([
        {"id": "ok1", "payload": 1},
        {"id": "bad id!", "payload": 1},
        {"id": "ok2", "payload": 2, "priority": "high"},
        {"id": "ok3", "payload": 3},
        {"id": "ok1", "payload": 1},
    ])
    assert [r["status"] for r in results] == [201, 400, 400, 201, 200]
    assert "id" in results[1]["error"]["errors"]
    assert "priority" in results[2]["error"]["errors"]
    assert topic.get("ok3").status_code == 200
    assert topic.get("ok2").status_code == 404


def test_batch_over_limit_is_413(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    answer = client.post(topic.url("/messages:batch"), headers=auth,
                         json={"messages": [{"payload": 1}] * 1001})
    assert answer.status_code == 413
    assert answer.content_type == "application/problem+json"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_bad_input_is_4xx_problem_naming_the_field_and_writes_nothing(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    cases = [
        ({"id": "b1", "payload": 1, "priority": "x"}, 400, "priority"),
        ({"id": "b2", "payload": 1, "priority": 70000}, 400, "priority"),
        ({"id": "b3", "payload": 1, "surprise": True}, 400, "surprise"),
        ({"id": "b4", "payload": 1, "deliver_at": "next tuesday"}, 400, "deliver_at"),
        ({"id": "b5", "payload": 1, "deliver_at": "2026-12-01T09:00:00"}, 400, "deliver_at"),
        ({"id": "b6", "payload": 1, "delay_ms": 400 * 86_400_000}, 400, "delay_ms"),
        ({"id": "b7", "payload": 1, "delay_ms": 5, "deliver_at": 1}, 400, "delay_ms"),
        ({"id": "b8"}, 400, "payload"),
        ({"id": "b9", "payload": 1, "local_time": "2026-12-01T09:00:00"}, 400, "timezone"),
        ({"id": "b10", "payload": 1, "local_time": "2026-12-01T09:00:00",
          "timezone": "Nowhere/Land"}, 400, "timezone"),
        ({"id": "b11", "payload": "x" * 70_000}, 413, None),
        ({"id": "b12", "payload_base64": "***"}, 400, "payload_base64"),
        ({"id": "b13", "payload": _nested(65)}, 400, "payload"),
    ]
    for body, status, field in cases:
        answer = client.post(topic.url("/messages"), json=body, headers=auth)
        assert answer.status_code == status, (body, answer.get_json())
        assert answer.content_type == "application/problem+json"
        problem = answer.get_json()
        if field:
            assert field in problem["errors"], (body, problem)
        assert topic.get(body["id"]).status_code == 404
    malformed = client.post(topic.url("/messages"), data="{not json",
                            content_type="application/json", headers=auth)
    assert malformed.status_code == 400
    assert malformed.content_type == "application/problem+json"
    for depth in (5_000, 100_000):  # past the parser's recursion limit: a 400, never a 500
        deep = client.post(topic.url("/messages"), content_type="application/json",
                           headers=auth, data='{"id": "deep", "payload": '
                           + "[" * depth + "]" * depth + "}")
        assert deep.status_code == 400, deep.get_json()
        assert deep.get_json()["errors"] == {"json": ["Nested too deeply."]}
    assert topic.get("deep").status_code == 404


def test_cancel_then_never_delivered(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(id="c1", delay_ms=300)
    assert client.delete(topic.url("/messages/c1"), headers=auth).status_code == 204
    assert client.delete(topic.url("/messages/c1"), headers=auth).status_code == 204
    assert topic.get("c1").get_json()["state"] == "cancelled"
    assert topic.lease(wait_ms=1200) == []
    assert client.delete(topic.url("/messages/nope"), headers=auth).status_code == 404


def test_server_id_rows_written_without_lwt_yield_to_every_transition(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """Server-made ids skip the enqueue LWT (a plain write at write time 1 µs); cancel,
    reschedule, lease and ack are LWTs and must each win over that first write."""
    topic = TopicClient(client, auth)
    first, second = (r["id"] for r in topic.batch([{"delay_ms": 60_000}, {"delay_ms": 200}]))
    assert client.delete(topic.url(f"/messages/{first}"), headers=auth).status_code == 204
    assert topic.get(first).get_json()["state"] == "cancelled"
    [m] = topic.lease(wait_ms=3000)
    assert m["id"] == second
    assert topic.ack(m) == 204
    assert topic.get(second).get_json()["state"] == "delivered"
    assert topic.lease(wait_ms=500) == []


def test_cancel_delivered_is_409(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(id="d1")
    [m] = topic.lease(wait_ms=2000)
    assert topic.ack(m) == 204
    assert client.delete(topic.url("/messages/d1"), headers=auth).status_code == 409


def test_reschedule_moves_and_refuses_when_not_scheduled(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(id="r1", delay_ms=60_000)
    soon = now_ms() + 500
    moved = client.patch(topic.url("/messages/r1"), json={"deliver_at": soon}, headers=auth)
    assert moved.status_code == 200 and parse_instant(moved.get_json()["deliver_at"]) == soon
    [m] = topic.lease(wait_ms=3000)
    assert m["id"] == "r1" and m["received_at"] >= soon
    again = client.patch(topic.url("/messages/r1"), json={"delay_ms": 1000}, headers=auth)
    assert again.status_code == 409


def test_tenants_never_see_each_other(client: FlaskClient, services: Services) -> None:
    _, alice = new_tenant_key(services, "alice")
    _, bob = new_tenant_key(services, "bob")
    topic = TopicClient(client, alice, name="shared-name")
    topic.enqueue(id="secret", delay_ms=60_000)
    assert client.get("/v1/topics/shared-name", headers=bob).status_code == 404
    assert client.get(topic.url("/messages/secret"), headers=bob).status_code == 404
    assert client.delete(topic.url("/messages/secret"), headers=bob).status_code == 404
    names = [t["name"] for t in client.get("/v1/topics", headers=bob).get_json()["topics"]]
    assert "shared-name" not in names


def test_deleted_topic_messages_never_delivered(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    topic.enqueue(id="gone", delay_ms=200)
    assert client.delete(topic.url(), headers=auth).status_code == 204
    assert client.get(topic.url(), headers=auth).status_code == 404
    reborn = TopicClient(client, auth, name=topic.name)
    assert reborn.lease(wait_ms=1000) == []
    assert reborn.get("gone").status_code == 404


def test_shards_change_refused_while_messages_live(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, shards=4)
    assert client.put(topic.url(), json={"shards": 8}, headers=auth).status_code == 200
    topic.enqueue(id="live", delay_ms=60_000)
    refused = client.put(topic.url(), json={"shards": 2}, headers=auth)
    assert refused.status_code == 409
    assert client.get(topic.url(), headers=auth).get_json()["shards"] == 8


def test_an_enqueue_whose_write_count_failed_is_503_and_its_retry_is_delivered(
        app: Flask, auth: dict[str, str], monkeypatch: Any) -> None:
    """The releasers' walk finds a pointer written behind its position only by its write
    count (bucket_writes): a count that failed fails the write, which is answered 503 with a
    retry hint, and the retry of the same id counts it and is delivered."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    counted = services.timeline.count_writes

    def failing(topic_uid: Any, written: dict[tuple[int, int], int]) -> Any:
        return {cell: RuntimeError("counter write timed out") for cell in written}

    monkeypatch.setattr(services.timeline, "count_writes", failing)
    answer = topic.enqueue(id="counted")
    assert answer.status_code == 503, answer.get_json()
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert answer.headers["Retry-After"]
    monkeypatch.setattr(services.timeline, "count_writes", counted)
    assert topic.enqueue(id="counted").status_code in (200, 201)
    assert topic.drain(1, within_s=15) == {"counted"}
