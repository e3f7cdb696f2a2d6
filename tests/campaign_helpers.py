"""Helpers of the campaign tests: the truth of a campaign read from its rows, operations run
to their end by an in-process runner."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask.testing import FlaskClient

from app.core.ids import home_of
from app.models import STATES, MessageState, Topic
from app.services import Services
from tests.consumers import TopicClient
from workers.operations import OperationRunner


def ttl_of(services: Services, topic_uid: uuid.UUID, message_id: str,
           table: str = "message_states", column: str = "state") -> int:
    """Seconds left of a message's cell (its state row's, or its payload's with
    table="message_bodies", column="payload")."""
    [found] = services.db.execute(
        f"SELECT TTL({column}) AS ttl FROM {{ks}}.{table} WHERE topic_uid = ? AND home = ? "
        "AND id = ?", (topic_uid, home_of(message_id), message_id))
    ttl: int = found["ttl"]
    return ttl


def rows_of(services: Services, topic_uid: uuid.UUID, campaign: str) -> list[MessageState]:
    """Every message row of a campaign, through its index (the truth the counters track)."""
    rows: list[MessageState] = []
    after, finished = "", False
    while not finished:
        ids, finished = services.campaigns.members_after(topic_uid, campaign, after, 1000)
        rows.extend(services.messages.get_many(topic_uid, ids).values())
        after = ids[-1] if ids else after
    return rows


def states_of(services: Services, topic_uid: uuid.UUID, campaign: str) -> dict[str, int]:
    counted = collections.Counter(r.state for r in rows_of(services, topic_uid, campaign))
    return {s: counted.get(s, 0) for s in STATES}


def topic_of(services: Services, auth: dict[str, str], name: str) -> Topic:
    """The topic `name` of the tenant whose key `auth` carries."""
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    assert tenant is not None
    found = services.topics.get(tenant, name)
    assert found is not None
    return found


def topic_uid(services: Services, auth: dict[str, str], name: str) -> uuid.UUID:
    return topic_of(services, auth, name).uid


def campaign(topic: TopicClient, name: str) -> dict[str, Any]:
    answer = topic.client.get(topic.url(f"/campaigns/{name}"), headers=topic.headers)
    assert answer.status_code == 200, answer.get_json()
    body: dict[str, Any] = answer.get_json()
    return body


def operation(client: FlaskClient, topic: TopicClient, op_id: str) -> dict[str, Any]:
    answer = client.get(topic.url(f"/operations/{op_id}"), headers=topic.headers)
    assert answer.status_code == 200, answer.get_json()
    body: dict[str, Any] = answer.get_json()
    return body


def wait_operation(topic: TopicClient, op_id: str, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        op = operation(topic.client, topic, op_id)
        if op["state"] != "running":
            return op
        time.sleep(0.1)
    raise AssertionError(f"operation {op_id} still running: {op}")


@contextmanager
def running_operations(services: Services, member: str = "test-runner") -> Iterator[None]:
    """An in-process runner ticking every 100 ms while the block runs (burst mode, as rq's
    tests run workers), stopped and joined on exit."""
    stop = threading.Event()
    runner = OperationRunner(services, member, stop.is_set)

    def loop() -> None:
        while not stop.is_set():
            runner.tick()
            stop.wait(0.1)

    thread = threading.Thread(target=loop, name="test-operations")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
