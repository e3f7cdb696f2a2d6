"""The Client against a served API: names and ids percent-encoded in paths, a call for every
route, a context manager, its version; Retry-After as an HTTP date and jittered backoff
against a stub that answers only what the API cannot be made to (503 with a date)."""

from __future__ import annotations

import email.utils
import http.server
import importlib.metadata
import threading
import time
from typing import Any

import duetime_client
import pytest
from duetime_client import ApiError, Client, Consumer


def test_ids_with_reserved_characters_stay_in_their_segment(api: Client, topic: str) -> None:
    api.enqueue(topic, {"n": 1}, id="a", delay_ms=3_600_000)
    for message_id in ("a?x=1", "a#frag", "a%2Fb", "a%"):
        with pytest.raises(ApiError) as refused:
            api.get(topic, message_id)
        # the API's own answer about that id: not message `a`, not another route
        assert refused.value.status == 400, (message_id, refused.value.problem)
        assert refused.value.problem["errors"] == {"id": [refused.value.problem["errors"][
            "id"][0]]}
    with pytest.raises(ApiError) as refused:
        api.cancel(topic, "a?x")
    assert refused.value.status == 400
    assert api.get(topic, "a")["state"] == "scheduled"  # not cancelled through `a?x`
    with pytest.raises(ApiError) as refused:
        api.get_topic(f"{topic}?x")
    # the topic route's answer about the whole name (not topic `topic` with a query)
    assert refused.value.status in (400, 404) and f"{topic}?x" in str(refused.value)
    # a `/` in a name or id: the API's 400, not the route the decoded path would reach
    for call in (lambda: api.get_topic(f"{topic}/stats"), lambda: api.get(topic, "a/ack"),
                 lambda: api.cancel(topic, "a/retry")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 400 and "path" in refused.value.problem["errors"]
    assert api.get(topic, "a")["state"] == "scheduled"
    # "." and "..": the API's 400 about the id, not the topic a dot segment would reach
    for message_id in (".", ".."):
        for call in (api.get, api.cancel):
            with pytest.raises(ApiError) as refused:
                call(topic, message_id)
            assert refused.value.status == 400 and "id" in refused.value.problem["errors"]
        with pytest.raises(ApiError) as refused:
            api.enqueue(topic, {"n": 1}, id=message_id)
        assert refused.value.status == 400
    assert api.get_topic(topic)["name"] == topic  # not deleted through messages/..


def test_a_call_for_every_route(api: Client, topic: str) -> None:
    assert api.healthz()["status"] == "ok"
    assert api.readyz()["status"] == "ready"
    webhook = f"{topic}-hook"
    before = api.put_topic(webhook, delivery={"mode": "webhook",
                                              "url": "http://127.0.0.1:9/hook"})
    try:
        rotated = api.rotate_signing_secret(webhook, overlap_seconds=60)
        assert rotated["signing_secret"] != before["signing_secret"]
        assert api.rotate_signing_secret(webhook)["signing_secret"] != rotated["signing_secret"]
    finally:
        api.delete_topic(webhook)


def test_stop_finishes_the_messages_in_hand_without_waiting_for_a_poll(
        api: Client, topic: str) -> None:
    handled: list[str] = []
    started = threading.Event()

    def slow(message: dict[str, Any]) -> None:
        started.set()
        time.sleep(1.5)
        handled.append(message["id"])

    consumer = Consumer(api, topic, slow, concurrency=2, batch=1, wait_ms=20_000).start()
    api.enqueue(topic, {"n": 1}, id="in-hand")
    assert started.wait(10)
    began = time.monotonic()
    assert consumer.stop(30)
    # the message in hand was finished and acked; the other thread's 20 s poll was cut
    assert handled == ["in-hand"] and api.get(topic, "in-hand")["state"] == "delivered"
    assert time.monotonic() - began < 5
    assert not any(t.is_alive() for t in consumer._threads)


def test_stop_with_nothing_in_hand_returns_at_once(api: Client, topic: str) -> None:
    consumer = Consumer(api, topic, lambda m: None, concurrency=3, wait_ms=20_000).start()
    time.sleep(1)  # every thread in its long poll
    began = time.monotonic()
    assert consumer.stop(30)
    assert time.monotonic() - began < 3


def test_the_client_is_a_context_manager_that_closes_its_connections() -> None:
    closed = threading.Event()

    class KeepAlive(_Stub):
        def finish(self) -> None:  # the client closed the kept-alive connection
            super().finish()
            closed.set()

    KeepAlive.answers = [200, 200]
    with _serving(KeepAlive) as base:
        with Client(base, "k") as client:
            client.healthz()
            client.healthz()
            assert not closed.wait(0.3)  # kept alive between calls
        assert closed.wait(5)


def test_the_version_is_the_distributions() -> None:
    assert duetime_client.__version__ == importlib.metadata.version("duetime-client")


def test_retry_after_as_an_http_date_is_waited_for() -> None:
    _Stub.answers = [503, 200]
    _Stub.retry_after = email.utils.formatdate(time.time() + 2, usegmt=True)
    with _serving(_Stub) as base:
        began = time.monotonic()
        assert Client(base, "k", backoff_s=0.01).healthz() == {"ok": True}
        assert time.monotonic() - began >= 1.0  # the date's second, not the 10 ms backoff


def test_backoff_has_jitter_and_never_less_than_its_base() -> None:
    from duetime_client.client import backoff_pause_s

    pauses = [backoff_pause_s(0.1, 2) for _ in range(50)]
    assert all(0.4 <= p <= 0.6 for p in pauses)
    assert len(set(pauses)) > 10


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers GETs with the next status of `answers` (Retry-After on a 503)."""
    protocol_version = "HTTP/1.1"
    answers: list[int] = []
    retry_after = "1"

    def do_GET(self) -> None:
        status = self.answers.pop(0) if self.answers else 200
        body = b'{"ok": true}' if status == 200 else b'{"title": "busy"}'
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", self.retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _serving:  # noqa: N801 - used as a context manager, like a function
    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
