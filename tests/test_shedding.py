"""Load shedding (app.ops.shedding): a /v1 request that waited too long for a thread is refused
with 503 problem+json and Retry-After at once; consuming calls and health checks never are;
a client cannot make its own request look late (or early) through the worker's header."""

from __future__ import annotations

import socket

from flask import Flask

from app.ops import metrics
from tests.consumers import TopicClient
from tests.test_request_limits import SLOW_PORT, few_threads  # noqa: F401 (a fixture)

LATE = {"HTTP_X_DUETIME_QUEUED_MS": "5000"}  # what the worker says of a request that waited


def test_a_request_that_waited_too_long_is_refused_at_once(
        app: Flask, auth: dict[str, str]) -> None:
    client = app.test_client()
    topic = TopicClient(client, auth)
    before = metrics.REQUESTS_SHED._value.get()
    late = client.post(topic.url("/messages"), headers=auth, json={"payload": 1},
                       environ_overrides=LATE)
    assert late.status_code == 503
    assert late.headers["Content-Type"] == "application/problem+json"
    assert late.headers["Retry-After"] == "1"
    assert late.get_json()["type"].endswith("overloaded")
    assert metrics.REQUESTS_SHED._value.get() == before + 1
    assert topic.get("x").status_code == 404  # in time: served
    prompt = client.post(topic.url("/messages"), headers=auth, json={"id": "m", "payload": 1},
                         environ_overrides={"HTTP_X_DUETIME_QUEUED_MS": "20"})
    assert prompt.status_code == 201


def test_consuming_calls_and_health_are_never_shed(app: Flask, auth: dict[str, str]) -> None:
    client = app.test_client()
    topic = TopicClient(client, auth)
    assert topic.enqueue(id="c1").status_code == 201
    leased = client.post(topic.url("/leases"), headers=auth, json={"max": 1, "wait_ms": 2000},
                         environ_overrides=LATE)
    assert leased.status_code == 200
    [m] = leased.get_json()["messages"]
    acked = client.post(topic.url("/messages/c1/ack"), headers=auth,
                        json={"lease_token": m["lease"]["token"]}, environ_overrides=LATE)
    assert acked.status_code == 204
    assert client.get("/readyz", environ_overrides=LATE).status_code == 200
    assert client.get("/healthz", environ_overrides=LATE).status_code == 200


def test_a_client_cannot_say_how_long_it_waited(few_threads: str) -> None:  # noqa: F811
    with socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=30) as conn:
        conn.sendall((f"GET /v1/topics HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {few_threads}\r\nX-Duetime-Queued-Ms: 99999\r\n"
                      "Connection: close\r\n\r\n").encode())
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
