"""Structured logs: one JSON event a line with the request's id, tenant, topic and message id,
one `request` event per request with its latency, and never the API key."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from app.ops.logs import JsonFormatter, RequestContext, TextFormatter
from tests.consumers import TopicClient


@pytest.fixture()
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    """The duetime loggers' events at INFO, formatted into a buffer (JSON unless changed)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestContext())
    logger = logging.getLogger("duetime")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
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
