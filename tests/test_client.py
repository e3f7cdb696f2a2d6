"""The Python client (duetime_client) against a served API (gunicorn on its own port, the test
keyspace, the real node): typed calls, errors as ApiError, the Consumer helper (ack, nack on
an exception, extend for a long handler and for a batch's messages waiting their turn,
stop), retries of 429/503, and the webhook signature check on a real push."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import threading
import time
from typing import Any

import pytest
import standardwebhooks
from duetime_client.client import (
    ApiError,
    ApiTimeout,
    ApiUnreachable,
    Client,
    Consumer,
    SignatureCheck,
    verify_signature,
    verify_webhook,
)
from flask import Flask

from app.config import Config
from app.services import Services
from tests.conftest import new_tenant_key
from tests.receiver import Receiver, receiving


@pytest.fixture()
def api(served: str, services: Services) -> Client:
    _, headers = new_tenant_key(services)
    return Client(served, headers["Authorization"].split()[1])


def test_typed_calls_and_errors(api: Client) -> None:
    assert api.put_topic("orders", max_attempts=3)["max_attempts"] == 3
    assert [t["name"] for t in api.list_topics()] == ["orders"]
    first = api.enqueue("orders", {"n": 1}, id="o-1", delay_ms=3_600_000)
    assert api.enqueue("orders", {"n": 1}, id="o-1", delay_ms=3_600_000)["id"] == first["id"]
    with pytest.raises(ApiError) as conflict:
        api.enqueue("orders", {"n": 2}, id="o-1")
    assert conflict.value.status == 409 and conflict.value.problem["type"].endswith("conflict")
    moved = api.reschedule("orders", "o-1", delay_ms=7_200_000)
    assert moved["deliver_at"] > first["deliver_at"]
    assert api.get("orders", "o-1")["payload"] == {"n": 1}
    results = api.enqueue_batch("orders", [{"payload": n, "campaign": "spring"}
                                           for n in range(3)])
    assert [r["status"] for r in results] == [201] * 3
    assert api.campaign("orders", "spring")["counts"]["scheduled"] == 3
    api.cancel("orders", "o-1")
    assert api.get("orders", "o-1")["state"] == "cancelled"
    with pytest.raises(ApiError) as missing:
        api.get("orders", "nope")
    assert missing.value.status == 404
    api.delete_topic("orders")
    assert api.list_topics() == []


def test_the_consumer_acks_nacks_extends_and_stops(api: Client) -> None:
    api.put_topic("jobs", max_attempts=5)
    api.enqueue_batch("jobs", [{"id": f"j{n}", "payload": n} for n in range(20)])
    api.enqueue("jobs", "slow", id="slow")
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def handle(message: dict[str, Any]) -> None:
        with lock:
            seen[message["id"]] = seen.get(message["id"], 0) + 1
            times = seen[message["id"]]
        if message["id"] == "j7" and times == 1:
            raise RuntimeError("first try fails")
        if message["id"] == "slow":
            time.sleep(3.5)  # past its 2 s lease: kept by extensions

    consumer = Consumer(api, "jobs", handle, concurrency=3, batch=5, lease_seconds=2,
                        wait_ms=500).start()
    ids = ["slow"] + [f"j{n}" for n in range(20)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and api.stats("jobs")["counts"]["delivered"] < 21:
        time.sleep(0.3)
    consumer.stop(10)
    states = {i: api.get("jobs", i) for i in ids}
    assert {s["state"] for s in states.values()} == {"delivered"}
    assert states["j7"]["attempts"] == 2 and "first try fails" in states["j7"]["last_error"]
    assert states["slow"]["attempts"] == 1 and seen["slow"] == 1  # never leased twice
    assert all(not t.is_alive() for t in consumer._threads)


def test_the_consumer_keeps_every_message_of_a_batch_leased_until_its_turn(api: Client) -> None:
    """A thread leases a batch and handles it in turn: the messages waiting for their turn
    stay leased too, so none is handled twice, however long the batch takes."""
    api.put_topic("queued", max_attempts=5)
    api.enqueue_batch("queued", [{"id": f"q{n}", "payload": n} for n in range(3)])
    seen: dict[str, int] = {}

    def handle(message: dict[str, Any]) -> None:
        seen[message["id"]] = seen.get(message["id"], 0) + 1
        time.sleep(1.2)  # the third starts 2.4 s after the lease, past its 2 s

    consumer = Consumer(api, "queued", handle, concurrency=1, batch=3, lease_seconds=2,
                        wait_ms=500).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and api.stats("queued")["counts"]["delivered"] < 3:
        time.sleep(0.3)
    consumer.stop(10)
    assert seen == {"q0": 1, "q1": 1, "q2": 1}
    assert [api.get("queued", f"q{n}")["attempts"] for n in range(3)] == [1, 1, 1]


class _Flaky(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = self.answers.pop(0)
        body = json.dumps({"id": "x", "deliver_at": 1, "state": "scheduled"} if status == 201
                          else {"title": "busy", "detail": "later"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status in (429, 503):
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_429_and_503_are_retried_then_given_up() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{server.server_address[1]}", "k", retries=3,
                        backoff_s=0.01)
        _Flaky.answers = [503, 429, 201]
        assert client.enqueue("t", 1)["id"] == "x"
        _Flaky.answers = [503] * 4
        with pytest.raises(ApiError) as gave_up:
            client.enqueue("t", 1)
        assert gave_up.value.status == 503 and _Flaky.answers == []
    finally:
        server.shutdown()


class _Cutting(http.server.BaseHTTPRequestHandler):
    """Reads each request, then closes the connection without an answer (or, with
    `stall_s`, answers nothing for that long first)."""
    seen: list[str] = []
    stall_s = 0.0

    def do_GET(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(f"{self.command} {self.path}")
        time.sleep(self.stall_s)
        self.close_connection = True

    def do_POST(self) -> None:
        self.do_GET()

    def log_message(self, *args: Any) -> None:
        pass


def test_no_answer_is_retried_only_where_a_repeat_is_harmless() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Cutting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/prefix"
    try:
        client = Client(url, "k", retries=2, backoff_s=0.01)
        with pytest.raises(ApiUnreachable):
            client.enqueue("t", 1)  # no id: a repeat could enqueue it twice
        assert _Cutting.seen == ["POST /prefix/v1/topics/t/messages"]
        _Cutting.seen.clear()
        with pytest.raises(ApiUnreachable):
            client.enqueue("t", 1, id="m1")
        with pytest.raises(ApiUnreachable):
            client.get("t", "m1")
        assert _Cutting.seen == ["POST /prefix/v1/topics/t/messages"] * 3 + [
            "GET /prefix/v1/topics/t/messages/m1"] * 3
        _Cutting.seen.clear()
        _Cutting.stall_s = 0.5
        with pytest.raises(ApiTimeout):
            Client(url, "k", timeout_s=0.2, retries=2).get("t", "m1")
        assert len(_Cutting.seen) == 1  # the call may have taken effect: not repeated
    finally:
        _Cutting.stall_s = 0.0
        server.shutdown()


def test_an_api_not_there_is_unreachable_after_the_retries() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(ApiUnreachable):
        Client(f"http://127.0.0.1:{port}", "k", retries=3, backoff_s=0.05).enqueue("t", 1)
    assert time.monotonic() - began >= 0.05 + 0.1 + 0.2  # each retry after its backoff


def test_a_real_push_verifies_and_a_tampered_or_replayed_one_does_not(
        api: Client, config: Config) -> None:
    """A POST is verified by the Standard Webhooks reference library (standardwebhooks, from
    PyPI) and by the client's own check; a changed body fails both, and the client's
    middleware refuses a correctly signed POST whose timestamp is past its tolerance (one
    captured 10 minutes ago and sent again)."""
    with receiving(Receiver()) as target:
        topic = api.put_topic("hooks", delivery={"mode": "webhook", "url": target.url})
        api.enqueue("hooks", {"hello": "world"}, id="signed")
        assert target.wait_for(lambda got: len(got) == 1, 20)
    arrival = target.arrivals[0]
    secret = topic["signing_secret"]
    assert secret.startswith("whsec_")
    assert arrival.headers["webhook-id"] == "signed"
    assert abs(int(arrival.headers["webhook-timestamp"]) - arrival.received_ms / 1000) < 5
    assert standardwebhooks.Webhook(secret).verify(arrival.body, arrival.headers) == {
        "hello": "world"}
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(arrival.body + b" ", arrival.headers)
    assert verify_webhook(secret, arrival.headers, arrival.body)
    assert not verify_webhook(secret, arrival.headers, arrival.body + b" ")
    # the deprecated body-only signature, for old receivers
    signature = arrival.headers["Duetime-Signature"]
    assert verify_signature(secret, arrival.body, signature)
    assert not verify_signature(secret, arrival.body + b" ", signature)
    assert not verify_signature(secret, arrival.body, None)

    checked = Flask("target")
    checked.add_url_rule("/hook", "hook", lambda: "ok", methods=["POST"])
    checked.wsgi_app = SignatureCheck(checked.wsgi_app, secret)  # type: ignore[method-assign]
    client = checked.test_client()
    standard = {k: arrival.headers[k]
                for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    ok = client.post("/hook", data=arrival.body, headers=standard)
    assert ok.status_code == 200 and ok.get_data() == b"ok"
    assert client.post("/hook", data=b"{}", headers=standard).status_code == 401
    assert client.post("/hook", data=arrival.body, headers={
        "Duetime-Signature": signature}).status_code == 401  # the replayable one is not enough
    captured = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    replayed = {"webhook-id": "signed", "webhook-timestamp": str(int(captured.timestamp())),
                "webhook-signature": standardwebhooks.Webhook(secret).sign(
                    "signed", captured, arrival.body.decode())}
    assert client.post("/hook", data=arrival.body, headers=replayed).status_code == 401
    fresh = dt.datetime.now(dt.UTC)
    resent = {**replayed, "webhook-timestamp": str(int(fresh.timestamp())),
              "webhook-signature": standardwebhooks.Webhook(secret).sign(
                  "signed", fresh, arrival.body.decode())}
    assert client.post("/hook", data=arrival.body, headers=resent).status_code == 200
