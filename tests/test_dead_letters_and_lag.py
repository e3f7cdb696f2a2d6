"""What the dashboard shows beside counts, on the real node: dead messages (listed newest
first with their last error, retried back to scheduled) and the delivery lag per minute."""

from __future__ import annotations

import time

from flask import Flask
from flask.testing import FlaskClient

from app.services import Services
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient


def _kill(client: FlaskClient, auth: dict[str, str], topic: TopicClient, message_id: str,
          error: str) -> None:
    """Lease the message and nack it on its last attempt (max_attempts=1): dead."""
    [m] = topic.lease(wait_ms=3000)
    assert m["id"] == message_id
    answer = client.post(topic.url(f"/messages/{message_id}/nack"), headers=auth,
                         json={"lease_token": m["lease"]["token"], "error": error})
    assert answer.status_code == 204


def test_dead_messages_are_listed_newest_first_with_their_last_error(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, max_attempts=1)
    for n in range(3):
        topic.enqueue(id=f"d{n}", payload={"n": n})
        _kill(client, auth, topic, f"d{n}", f"broken {n}")
        time.sleep(0.01)  # distinct dead_at
    topic.enqueue(id="alive", payload={})
    listed = client.get(topic.url("/dead-letters"), headers=auth).get_json()["messages"]
    assert [m["id"] for m in listed] == ["d2", "d1", "d0"]
    assert [m["last_error"] for m in listed] == ["broken 2", "broken 1", "broken 0"]
    assert listed[0]["payload"] == {"n": 2} and listed[0]["state"] == "dead"
    assert [m["id"] for m in client.get(topic.url("/dead-letters?limit=2"),
                                        headers=auth).get_json()["messages"]] == ["d2", "d1"]


def test_a_retried_message_is_scheduled_again_leased_again_and_no_longer_listed(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, max_attempts=1)
    topic.enqueue(id="r1", payload={"x": 1})
    _kill(client, auth, topic, "r1", "target down")
    counts_before = client.get(topic.url("/stats"), headers=auth).get_json()["counts"]
    assert counts_before["dead"] == 1

    answer = client.post(topic.url("/messages/r1/retry"), headers=auth)
    assert answer.status_code == 200, answer.get_json()
    body = answer.get_json()
    assert body["state"] == "scheduled" and body["attempts"] == 0
    assert body["last_error"] == "target down"
    assert client.get(topic.url("/dead-letters"), headers=auth).get_json()["messages"] == []
    counts = client.get(topic.url("/stats"), headers=auth).get_json()["counts"]
    assert (counts["dead"], counts["scheduled"]) == (0, 1)

    [m] = topic.lease(wait_ms=3000)
    assert (m["id"], m["attempt"], m["payload"]) == ("r1", 1, {"x": 1})
    again = client.post(topic.url("/messages/r1/retry"), headers=auth)
    assert again.status_code == 409
    assert again.headers["Content-Type"] == "application/problem+json"
    assert topic.ack(m) == 204
    assert client.post(topic.url("/messages/nope/retry"), headers=auth).status_code == 404


def test_a_message_dead_by_attempts_at_lease_time_is_listed(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """A lease that expires on the last attempt makes the message dead at the next pass."""
    topic = TopicClient(client, auth, max_attempts=1, lease_seconds=1)
    topic.enqueue(id="e1", payload={})
    [m] = topic.lease(wait_ms=3000)
    assert m["id"] == "e1"
    assert topic.lease(wait_ms=2500) == []  # its lease expired; the pass made it dead
    assert topic.get("e1").get_json()["state"] == "dead"
    listed = client.get(topic.url("/dead-letters"), headers=auth).get_json()["messages"]
    assert [m["id"] for m in listed] == ["e1"]
    assert listed[0]["last_error"] == "max_attempts reached"


def test_another_tenant_sees_neither_the_list_nor_the_retry(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    topic = TopicClient(client, auth, max_attempts=1)
    topic.enqueue(id="mine", payload={})
    _kill(client, auth, topic, "mine", "x")
    _, other = new_tenant_key(services)
    assert client.get(topic.url("/dead-letters"), headers=other).status_code == 404
    assert client.post(topic.url("/messages/mine/retry"), headers=other).status_code == 404


def test_the_lag_of_every_message_handed_out_is_counted_in_its_minute(
        app: Flask, auth: dict[str, str]) -> None:
    client = app.test_client()
    topic = TopicClient(client, auth)
    topic.batch([{"payload": i, "delay_ms": 0} for i in range(7)])
    leased = topic.drain(7, within_s=10)
    assert len(leased) == 7
    app.extensions["duetime"].lag.flush()
    minutes = client.get(topic.url("/lag"), headers=auth).get_json()["minutes"]
    assert len(minutes) == 60
    assert sum(m["count"] for m in minutes) == 7
    busy = [m for m in minutes if m["count"]]
    assert all(m["p50_ms"] is not None and m["p50_ms"] <= m["p99_ms"] <= m["max_ms"]
               for m in busy)
    assert minutes[-1]["to"] > minutes[0]["from"]
    assert all(m["p50_ms"] is None and m["max_ms"] is None for m in minutes if not m["count"])
    assert len(client.get(topic.url("/lag?minutes=5"), headers=auth).get_json()["minutes"]) == 5
    bad = client.get(topic.url("/lag?minutes=0"), headers=auth)
    assert bad.status_code == 400 and bad.headers["Content-Type"] == "application/problem+json"
