"""Structured logs: one JSON event a line with the request's id, tenant, topic and message id,
one `request` event per request with its latency (a success's at debug), and never the API
key."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from app.ops.logs import JsonFormatter, RequestContext, TextFormatter, configure
from tests.consumers import TopicClient


@pytest.fixture()
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    """The duetime loggers' events at DEBUG, formatted into a buffer (JSON unless changed)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestContext())
    logger = logging.getLogger("duetime")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield buffer, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_each_request_is_one_json_event_with_its_context(
        client: FlaskClient, auth: dict[str, str],
        captured: tuple[io.StringIO, logging.Handler]) -> None:
    buffer, _ = captured
    topic = TopicClient(client, auth)
    answer = client.post(topic.url("/messages"), json={"id": "m1", "payload": 1},
                         headers={**auth, "X-Request-Id": "abc-123"})
    assert answer.status_code == 201
    assert answer.headers["X-Request-Id"] == "abc-123"
    got = client.get(topic.url("/messages/m1"), headers={**auth, "X-Request-Id": "bad id!"})
    generated = got.headers["X-Request-Id"]
    assert generated != "bad id!" and len(generated) == 16
    events = [json.loads(line) for line in buffer.getvalue().splitlines()]
    requests = {e["request_id"]: e for e in events if e["message"] == "request"}
    enqueued, read = requests["abc-123"], requests[generated]
    assert enqueued["method"] == "POST" and enqueued["status"] == 201
    assert enqueued["level"] == "debug"
    assert enqueued["topic"] == topic.name and enqueued["tenant"].startswith("t")
    assert enqueued["path"] == f"/v1/topics/{topic.name}/messages"
    assert isinstance(enqueued["latency_ms"], float) and enqueued["latency_ms"] > 0
    assert read["message_id"] == "m1" and read["status"] == 200
    assert all(e["level"] and e["time"].endswith("Z") for e in events)
    key = auth["Authorization"].split()[1]
    assert key not in buffer.getvalue()


def test_text_lines_carry_the_same_context(
        client: FlaskClient, auth: dict[str, str],
        captured: tuple[io.StringIO, logging.Handler]) -> None:
    buffer, handler = captured
    handler.setFormatter(TextFormatter())
    topic = TopicClient(client, auth)
    assert client.get(topic.url("/messages/none"), headers={
        **auth, "X-Request-Id": "req-9"}).status_code == 404
    line = next(x for x in buffer.getvalue().splitlines() if "request_id=req-9" in x)
    assert " INFO duetime.requests request " in line
    assert f"topic={topic.name}" in line and "message_id=none" in line
    assert " method=GET " in line and " status=404 " in line and " latency_ms=" in line


def test_at_info_a_success_is_not_logged_and_a_refusal_is(
        client: FlaskClient, auth: dict[str, str],
        captured: tuple[io.StringIO, logging.Handler]) -> None:
    buffer, _ = captured
    logging.getLogger("duetime").setLevel(logging.INFO)
    topic = TopicClient(client, auth)
    assert client.post(topic.url("/messages"), json={"payload": 1}, headers={
        **auth, "X-Request-Id": "ok-1"}).status_code == 201
    assert client.post(topic.url("/messages"), json={"payload": 1, "delay_ms": -5}, headers={
        **auth, "X-Request-Id": "bad-1"}).status_code == 400
    events = [json.loads(line) for line in buffer.getvalue().splitlines()]
    logged = {e["request_id"]: e for e in events if e["message"] == "request"}
    assert "ok-1" not in logged
    assert logged["bad-1"]["level"] == "info" and logged["bad-1"]["status"] == 400


def test_the_level_comes_from_duetime_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    root, own = logging.getLogger(), logging.getLogger("duetime")
    handlers, root_level, own_level = root.handlers[:], root.level, own.level
    try:
        monkeypatch.setenv("DUETIME_LOG_LEVEL", "debug")
        configure("text")
        assert own.getEffectiveLevel() == logging.DEBUG
        assert root.level == logging.INFO  # the driver's debug events stay out
        monkeypatch.setenv("DUETIME_LOG_LEVEL", "warning")
        configure("text")
        assert own.getEffectiveLevel() == logging.WARNING
        monkeypatch.setenv("DUETIME_LOG_LEVEL", "loud")
        with pytest.raises(ValueError, match="DUETIME_LOG_LEVEL"):
            configure("text")
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        own.setLevel(own_level)
