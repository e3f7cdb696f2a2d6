"""Prometheus metrics and the clock check on the real node: a process's metrics parse as the
text exposition, its message counters move by exactly what the test did, delivery lag and
pacing waits are observed, and `/readyz` reports this clock against Cassandra's. A served API
shows its workers' metrics on a port of their own, never on the API's port."""

from __future__ import annotations

import gc
import threading
import time
import urllib.error
import urllib.request
from collections import deque

import pytest
from duetime_client import Client
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from app.config import Config
from app.ops import metrics
from app.services import Services, system_clock_ms
from tests.campaign_helpers import campaign
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms
from tests.serving import serving

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str) -> Samples:
    """Every sample of a text exposition by (name, sorted labels); fails unless it parses."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def scrape() -> Samples:
    """This process's metrics, as its metrics port would serve them."""
    return parsed(metrics.exposition().decode())


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_message_counters_move_by_exactly_what_was_done(
        client: FlaskClient, services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    # the suite makes hundreds of tenants in this process: past the bound of series their
    # counts go to `_other` (app.ops.metrics.message_labels), where other tests' work moves them
    monkeypatch.setattr(metrics, "MAX_TENANT_SERIES", 1_000_000)
    monkeypatch.setattr(metrics, "MAX_TOPIC_SERIES", 1_000_000)
    tenant, auth = new_tenant_key(services)
    topic = TopicClient(client, auth, max_attempts=1)
    labels = {"tenant": tenant, "topic": topic.name}
    before = scrape()
    now = now_ms()
    topic.batch([{"id": f"m{n}", "deliver_at": now - 10} for n in range(5)])
    topic.batch([{"id": "m0", "deliver_at": now - 10}])  # the same message again: not new
    assert topic.enqueue(id="later", deliver_at=now + 3_600_000).status_code == 201
    leased = topic.lease(3)
    assert len(leased) == 3
    assert [topic.ack(m) for m in leased[:2]] == [204, 204]
    nack = client.post(topic.url(f"/messages/{leased[2]['id']}/nack"), headers=auth,
                       json={"lease_token": leased[2]["lease"]["token"], "error": "boom"})
    assert nack.status_code == 204  # max_attempts 1: dead
    assert client.delete(topic.url("/messages/later"), headers=auth).status_code == 204
    after = scrape()
    assert moved(before, after, "duetime_messages_enqueued_total", **labels) == 6
    assert moved(before, after, "duetime_messages_delivered_total", **labels) == 2
    assert moved(before, after, "duetime_messages_dead_total", **labels) == 1
    assert moved(before, after, "duetime_messages_cancelled_total", **labels) == 1
    assert moved(before, after, "duetime_delivery_lag_seconds_count", mode="pull") >= 3
    assert moved(before, after, "duetime_http_request_duration_seconds_count",
                 endpoint="messages.MessageCollection", method="POST", status="2xx") == 1
    assert moved(before, after, "duetime_cassandra_request_duration_seconds_count") > 0


def test_a_paced_campaigns_wait_for_its_turn_is_observed(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    now = now_ms()
    topic.batch([{"campaign": "slow", "deliver_at": now - 10} for _ in range(4)])
    answer = client.patch(topic.url("/campaigns/slow"), headers=auth,
                          json={"max_per_second": 2})
    assert answer.status_code == 200, answer.get_json()
    before = scrape()
    assert campaign(topic, "slow")["counts"]["scheduled"] == 4
    assert len(topic.drain(4, within_s=10)) == 4  # 2 a second: the last waits about 1.5 s
    after = scrape()
    assert moved(before, after, "duetime_pacing_wait_seconds_count") == 4
    waited = moved(before, after, "duetime_pacing_wait_seconds_sum")
    # slots 0.5 s apart from the first lease, which comes a moment after deliver_at: the
    # waits are that moment plus 0, 0.5, 1 and 1.5 s
    assert 3.0 * 0.9 <= waited <= 3.0 + 4 * 1.0, waited


def test_readyz_compares_this_clock_with_cassandras(app: Flask, config: Config) -> None:
    ready = app.test_client().get("/readyz")
    assert ready.status_code == 200
    assert abs(ready.get_json()["clock_skew_ms"]) < config.safety_lag_ms / 2
    ahead = create_app(config, clock=lambda: system_clock_ms() + 2 * config.safety_lag_ms)
    try:
        skewed = ahead.test_client().get("/readyz")
        assert skewed.status_code == 503
        assert skewed.headers["Content-Type"] == "application/problem+json"
        assert skewed.get_json()["type"].endswith("clock-skewed")
        assert int(skewed.headers["Retry-After"]) > 0
        samples = scrape()
        assert samples[("duetime_clock_skew_seconds", ())] >= 1.5 * config.safety_lag_ms / 1000
    finally:
        ahead.extensions["duetime"].close()
    assert app.test_client().get("/readyz").status_code == 200


def test_every_full_garbage_collection_is_timed(app: Flask) -> None:
    """A process made by create_app times its collections: a full collection that frees a
    hundred thousand objects in cycles is one more observation of generation 2, no longer
    than gc.collect() took (automatic collections held off meanwhile)."""
    gc.disable()
    try:
        cycles = []
        for _ in range(100_000):
            node: list[object] = []
            node.append(node)
            cycles.append(node)
        del cycles, node
        before = scrape()
        started = time.perf_counter()
        freed = gc.collect(2)
        took = time.perf_counter() - started
        after = scrape()
    finally:
        gc.enable()
    assert freed >= 100_000
    assert moved(before, after, "duetime_gc_pause_seconds_count", generation="2") == 1
    paused = moved(before, after, "duetime_gc_pause_seconds_sum", generation="2")
    assert 0 < paused <= took


def test_a_collection_while_its_thread_holds_a_metric_lock_does_not_wait_for_it() -> None:
    """The collector's callback runs on whichever thread the collection interrupted, which
    may be inside prometheus_client holding a lock (a new series' setup allocates): timing
    the collection must not take a metric's lock, or that thread would wait for itself."""
    metrics.time_collections()
    done = threading.Event()

    def collect_holding_the_lock() -> None:
        with metrics.GC_PAUSE._lock:
            gc.collect(2)
        done.set()

    threading.Thread(target=collect_holding_the_lock, daemon=True).start()
    if not done.wait(10):
        # a plain Lock may be released by another thread: the rest of the suite, whose
        # requests observe metrics, must not wait for the stuck one too
        metrics.GC_PAUSE._lock.release()
        pytest.fail("the collection waited for a metric lock its own thread held")
    metrics.flush_collections()  # observed outside the collection


class _EmptiedOnAsking(deque[tuple[int, float]]):
    """Timed collections that another thread's flush takes between this one's look and its
    pop: asked whether it holds any, it answers as it was, then is empty."""

    def __bool__(self) -> bool:
        held = len(self) > 0
        self.clear()
        return held


def test_flushes_of_several_threads_never_fail_a_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's request threads each flush the timed collections after their request:
    one that finds the last taken by another between its look and its pop carries on
    (before, IndexError, and that request answered 500)."""
    monkeypatch.setattr(metrics, "_gc_pauses", _EmptiedOnAsking([(2, 0.001)]))
    metrics.flush_collections()
    monkeypatch.setattr(metrics, "_gc_pauses", deque([(2, 0.001), (0, 0.0002)]))
    before = metrics.GC_PAUSE.labels("0")._sum.get()
    metrics.flush_collections()
    assert not metrics._gc_pauses
    assert metrics.GC_PAUSE.labels("0")._sum.get() == pytest.approx(before + 0.0002)


API_PORT, METRICS_PORT = 18095, 18096


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_a_served_api_shows_its_metrics_on_their_port_and_not_on_the_api_port(
        config: Config, services: Services) -> None:
    tenant, auth = new_tenant_key(services)
    with serving(config.keyspace, API_PORT, DUETIME_WEB_WORKERS="2",
                 DUETIME_API_METRICS_PORT=str(METRICS_PORT)) as base:
        client = Client(base, auth["Authorization"].removeprefix("Bearer "))
        client.put_topic("counted")
        before = parsed(_get(f"http://127.0.0.1:{METRICS_PORT}/metrics")[2])
        for n in range(4):  # spread over both workers
            client.enqueue("counted", n, delay_ms=3_600_000)
        status, kind, text = _get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
        assert status == 200 and kind.startswith("text/plain; version=0.0.4")
        after = parsed(text)
        labels = {"tenant": tenant, "topic": "counted"}
        assert moved(before, after, "duetime_messages_enqueued_total", **labels) == 4
        assert moved(before, after, "duetime_http_request_duration_seconds_count",
                     endpoint="messages.MessageCollection", method="POST", status="2xx") == 4
        status, kind, text = _get(f"{base}/metrics")
        assert (status, kind) == (404, "application/problem+json")
        assert "counted" not in text
        assert [_get(f"{base}{path}")[0] for path in ("/healthz", "/readyz", "/")] == [200] * 3
