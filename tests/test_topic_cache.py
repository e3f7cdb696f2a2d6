"""The API's topic cache on the real node: another process's change reaches it within about
one follow period, this process's at once; lookups slower than the follower reads read
through, and a cache no longer busy stops reading."""

from __future__ import annotations

import time
from typing import Any

from flask import Flask

from app import create_app
from app.config import Config
from app.models import Topic
from app.services import Services
from app.store.topics import TopicStore
from app.topics import cache as topic_cache
from app.topics.cache import TopicCache
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient


def _keep_busy(cache: TopicCache, tenant: str, name: str, seconds: float) -> None:
    """Look the topic up every 20 ms for `seconds`: often enough for the cache to follow."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        cache.get(tenant, name)
        time.sleep(0.02)


def _wait_for(check: Any, within_s: float) -> float:
    """Seconds until check() held; fails past within_s."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within_s, "not within the bound"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_topic_recreated_by_another_process_is_used_at_once(
        app: Flask, config: Config, services: Services) -> None:
    tenant, auth = new_tenant_key(services)
    other = create_app(config)  # another API process, with a cache of its own
    other_services: Services = other.extensions["duetime"]
    store = CountingStore(other_services.db)
    other_services.topic_cache = cache = TopicCache(store)
    try:
        here, there = app.test_client(), other.test_client()
        topic = TopicClient(here, auth)

        def enqueue_there(payload: int) -> int:
            answer = there.post(topic.url("/messages"), headers=auth, json={"payload": payload})
            return int(answer.status_code)

        assert enqueue_there(1) == 201
        # busy: followed since, entries are kept once past the creation's change
        _keep_busy(cache, tenant, topic.name, topic_cache.CLOCK_MARGIN_MS / 1000 + 0.2)
        assert store.changes_read >= 2
        assert enqueue_there(2) == 201
        reads = store.topics_read
        assert enqueue_there(3) == 201
        assert store.topics_read == reads  # from the cache
        old_uid = cache.get(tenant, topic.name).uid  # type: ignore[union-attr]
        assert here.delete(topic.url(), headers=auth).status_code == 204
        assert here.put(topic.url(), headers=auth, json={"max_attempts": 3}).status_code == 201
        new_uid = services.topics.get(tenant, topic.name).uid  # type: ignore[union-attr]
        assert new_uid != old_uid
        # one follow period and a write's latency, with room for a busy machine
        _wait_for(lambda: cache.get(tenant, topic.name).uid == new_uid, 2)  # type: ignore[union-attr]
        answer = there.post(topic.url("/messages"), headers=auth, json={"payload": 4})
        assert answer.status_code == 201
        got = here.get(topic.url(f"/messages/{answer.get_json()['id']}"), headers=auth)
        assert got.status_code == 200  # on the topic as it is now
        assert here.delete(topic.url(), headers=auth).status_code == 204
        _wait_for(lambda: enqueue_there(5) == 404, 2)
    finally:
        other_services.close()


def test_this_processs_own_change_applies_to_its_next_request(
        app: Flask, services: Services) -> None:
    _, auth = new_tenant_key(services)
    client = app.test_client()
    topic = TopicClient(client, auth, max_attempts=1)
    for n in range(2):  # cached from here on
        assert topic.enqueue(id=f"m{n}").status_code == 201
    assert client.put(topic.url(), headers=auth, json={"max_attempts": 5}).status_code == 200
    leased = topic.lease(2)
    nack = client.post(topic.url(f"/messages/{leased[0]['id']}/nack"), headers=auth,
                       json={"lease_token": leased[0]["lease"]["token"], "delay_ms": 0})
    assert nack.status_code == 204
    # with the old max_attempts of 1 the nack would have made it dead
    assert topic.get(leased[0]["id"]).get_json()["state"] == "scheduled"


class CountingStore(TopicStore):
    """The real store, counting its reads of topics and of topic_changes."""

    changes_read = 0
    topics_read = 0

    def get(self, tenant: str, name: str) -> Topic | None:
        self.topics_read += 1
        return super().get(tenant, name)

    def changes_since(self, since_ms: int) -> list[Any]:
        self.changes_read += 1
        return super().changes_since(since_ms)


def test_slow_lookups_read_through_and_a_cache_no_longer_busy_stops_reading(
        services: Services) -> None:
    store = CountingStore(services.db)
    cache = TopicCache(store)
    try:
        for _ in range(3):  # a long poll's lookup every few seconds: no follower for it
            assert cache.get("nobody", "nothing") is None
            time.sleep(0.3)
        assert store.topics_read == 3
        assert store.changes_read == 0
        _keep_busy(cache, "nobody", "nothing", 0.5)  # 25 lookups: it follows
        assert store.changes_read >= 2
        read = store.topics_read
        _keep_busy(cache, "nobody", "nothing", 0.3)
        assert store.topics_read == read  # from the cache while followed
        time.sleep(topic_cache.BUSY_SPAN_MS / 1000 + 0.3)  # idle: the follower parks
        parked = store.changes_read
        time.sleep(0.5)
        assert store.changes_read == parked
        assert cache.get("nobody", "nothing") is None  # read through again
        assert store.topics_read == read + 1
    finally:
        cache.close()
