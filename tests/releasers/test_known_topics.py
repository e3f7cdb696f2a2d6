"""What a releaser knows of topics (workers/topics.py): the changes other processes write
are followed while a full read of every topic runs, and a full read that began before a
topic was made does not take it for gone."""

from __future__ import annotations

import threading
import uuid

import pytest
from flask.testing import FlaskClient

from app.models import Topic
from app.services import Services
from tests.consumers import TopicClient
from tests.releasing import tenant_of
from tests.waiting import wait_until
from workers.topics import KnownTopics


def test_a_topic_made_while_every_topic_is_read_is_followed_and_stays(
        services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full read (every DUETIME_TOPIC_REFRESH_MS) held up by a slow node: a topic made
    meanwhile is known from the next step on, before the read returns (its first message
    may be due in 200 ms; with 10,000 topics the read takes a while); the read, begun before
    the topic existed, then leaves it known and does not report it gone."""
    known = KnownTopics(services)
    assert known.step() == set()  # the first full read, made by the step itself
    before = services.topics.all()
    release, returned = threading.Event(), threading.Event()

    def slow_all() -> list[Topic]:
        release.wait(30)
        returned.set()
        return before  # as read before the topic was made

    monkeypatch.setattr(services.topics, "all", slow_all)
    known._read_all_at = -services.config.topic_refresh_ms  # a full read is due
    known.step()  # starts it
    topic = TopicClient(client, auth)
    uid = services.topics.get(tenant_of(services, auth), topic.name).uid
    gone: set[uuid.UUID] = set()
    try:
        assert wait_until(lambda: gone.update(known.step()) or uid in known.by_uid, 5)
        assert not returned.is_set()  # followed while the full read still ran
    finally:
        release.set()
    assert wait_until(lambda: gone.update(known.step()) or known._reading is None, 10)
    assert returned.is_set()
    assert uid in known.by_uid and uid not in gone
