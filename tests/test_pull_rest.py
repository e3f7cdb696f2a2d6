"""Long polls on a quiet topic rest (app.pull_wakes, app.poll_groups) on the real node: a
pass that finds nothing reads again only at the earliest pointer it saw ahead, at a wake-up
or after an idle period, and messages still arrive on time: written by another process (its
wake-up a datagram), due later than the rest began, or with the wake-up lost. An idle read
after one that found nothing reads the topic's write counts only (app.quiet_marks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from app import create_app, metrics, pull_wakes
from app.config import Config
from app.models import Pointer
from app.services import Services
from app.timeline import COUNTED_AHEAD_MS
from app.timeparse import format_ms, parse_instant
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms


@pytest.fixture()
def ready_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process may rest as soon as it is registered (every writer here reads the
    addresses after that: each is a new process that has sent nothing yet)."""
    monkeypatch.setattr(pull_wakes, "READY_AFTER_S", 0)


def _services(app: Flask) -> Services:
    services: Services = app.extensions["duetime"]
    return services


def _recording_starts(owner: Any, method: str) -> list[float]:
    """Record when each call of owner.method starts (monotonic s; the real calls still run)."""
    started: list[float] = []
    real = getattr(owner, method)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        started.append(time.monotonic())
        return real(*args, **kwargs)

    setattr(owner, method, recorded)
    return started


def _counting_scans(services: Services) -> list[float]:
    """When each timeline read of a lease pass starts."""
    return _recording_starts(services.scanner, "scan")


def _counting_count_reads(services: Services) -> list[float]:
    """When each read of a topic's write counts starts."""
    return _recording_starts(services.timeline, "write_counts")


@pytest.fixture()
def reader(config: Config, ready_at_once: None) -> Iterator[Flask]:
    app = create_app(config)
    yield app
    _services(app).close()


@pytest.fixture()
def writer(config: Config) -> Iterator[Flask]:
    app = create_app(config)
    yield app
    _services(app).close()


def _until_ready(app: Flask, topic: TopicClient) -> None:
    topic.lease(max_messages=1, wait_ms=0)  # a lease call starts the listener
    deadline = time.monotonic() + 10
    while not _services(app).pull_wakes.ready():
        assert time.monotonic() < deadline, "the listener never registered"
        time.sleep(0.05)


def _waiting(topic: TopicClient, wait_ms: int) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def call() -> None:
        out["messages"] = topic.lease(max_messages=1, wait_ms=wait_ms)
        out["at"] = now_ms()

    thread = threading.Thread(target=call)
    thread.start()
    return thread, out


def test_a_scan_peeks_past_its_window_at_the_earliest_pointer_not_known_spent(
        config: Config, services: Services) -> None:
    tenant, auth = new_tenant_key(services)
    app = create_app(config)
    topic = TopicClient(app.test_client(), auth)
    now = now_ms()
    for name, ahead in (("later", 1500), ("sooner", 800)):
        assert topic.enqueue(id=name, deliver_at=format_ms(now + ahead)).status_code == 201
    known = services.topics.get(tenant, topic.name)
    assert known is not None
    found = services.scanner.scan(known, now, 10, ahead_ms=100, peek_ms=2000)
    assert found.due == [] and found.next_ms == now + 800 and not found.cut
    assert services.scanner.scan(known, now, 10, ahead_ms=100).next_ms is None
    # one known spent is passed over; one within the window is due, not peeked at
    services.scanner.spend(known, [Pointer(now + 800, "sooner", 1, 0, 0)])
    assert services.scanner.scan(known, now, 10, ahead_ms=100, peek_ms=2000).next_ms == (
        now + 1500)
    found = services.scanner.scan(known, now + 1450, 10, ahead_ms=100, peek_ms=2000)
    assert [d.row.id for d in found.due] == ["later"] and found.next_ms is None
    _services(app).close()


def test_a_resting_long_poll_reads_once_an_idle_period_and_wakes_for_another_process(
        reader: Flask, writer: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(reader.test_client(), auth)
    other = TopicClient(writer.test_client(), auth, name=topic.name)
    _until_ready(reader, topic)
    scans = _counting_scans(_services(reader))
    waiting, out = _waiting(topic, 10_000)
    time.sleep(2.5)
    # one read when the call came, then one an idle period (1 s); unrested, one per 25 ms
    assert 2 <= len(scans) <= 4, len(scans)
    heard = metrics.WAKEUPS_RECEIVED.labels("pull")._value.get()
    sent, sent_s = now_ms(), time.monotonic()
    assert other.enqueue(id="now").status_code == 201
    waiting.join(10)
    [message] = out["messages"]
    assert message["id"] == "now"
    # the datagram ended the rest: a read began at once, not at the next idle read (up to
    # a second later)
    assert metrics.WAKEUPS_RECEIVED.labels("pull")._value.get() > heard
    assert min(s for s in scans if s > sent_s) - sent_s < 0.2, [s - sent_s for s in scans]
    assert out["at"] - sent < 500, out["at"] - sent
    assert topic.ack(message) == 204


def test_a_resting_long_poll_gets_a_message_due_later_at_its_due_time(
        reader: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(reader.test_client(), auth)
    _until_ready(reader, topic)
    due = now_ms() + 2600
    assert topic.enqueue(id="later", deliver_at=format_ms(due)).status_code == 201
    time.sleep(0.1)  # its own write woke it; what follows rests and peeks
    scans = _counting_scans(_services(reader))
    waiting, out = _waiting(topic, 10_000)
    waiting.join(10)
    [message] = out["messages"]  # TopicClient checks: not before deliver_at
    assert parse_instant(message["deliver_at"]) == due
    assert out["at"] - due < 300, out["at"] - due
    assert len(scans) <= 6, len(scans)
    assert topic.ack(message) == 204


def _unheralded(reader: Flask, writer: Flask, auth: dict[str, str], wait_ms: int = 10_000
                ) -> tuple[TopicClient, TopicClient, threading.Thread, dict[str, Any]]:
    """A topic with a call long-polling it in `reader`, and a client of it in `writer`,
    whose wake-ups are lost."""
    topic = TopicClient(reader.test_client(), auth)
    other = TopicClient(writer.test_client(), auth, name=topic.name)
    _services(writer).pull_wakes.tell = lambda topic_uid: None  # type: ignore[method-assign]
    _until_ready(reader, topic)
    waiting, out = _waiting(topic, wait_ms)
    return topic, other, waiting, out


def _arrives_within(within_ms: int, topic: TopicClient, other: TopicClient,
                    waiting: threading.Thread, out: dict[str, Any]) -> None:
    """A message `other` enqueues now is the waiting call's answer within within_ms."""
    sent = now_ms()
    assert other.enqueue(id="unheralded").status_code == 201
    waiting.join(within_ms / 1000 + 5)
    [message] = out["messages"]
    assert message["id"] == "unheralded"
    assert out["at"] - sent < within_ms, out["at"] - sent
    assert topic.ack(message) == 204


def test_a_lost_wake_up_delays_a_message_by_at_most_the_idle_period(
        reader: Flask, writer: Flask, auth: dict[str, str]) -> None:
    topic, other, waiting, out = _unheralded(reader, writer, auth)
    time.sleep(1.5)
    _arrives_within(_services(reader).config.pull_idle_ms + 500, topic, other, waiting, out)


def test_a_quiet_topic_s_idle_reads_check_its_write_counts_not_its_partitions(
        reader: Flask, writer: Flask, auth: dict[str, str]) -> None:
    topic, other, waiting, out = _unheralded(reader, writer, auth)
    time.sleep(1.5)  # the call's first read, then one that peeks and leaves a quiet mark
    scans = _counting_scans(_services(reader))
    checked = metrics.QUIET_CHECKS._value.get()
    time.sleep(3)
    # one idle read a second, each of the counts alone (without the mark, 3 timeline reads)
    assert scans == [] and metrics.QUIET_CHECKS._value.get() - checked >= 2
    # its wake-up lost, its count not: the next idle read finds the count moved
    _arrives_within(_services(reader).config.pull_idle_ms + 500, topic, other, waiting, out)
    assert len(scans) >= 1


def test_a_write_neither_counted_nor_heralded_is_read_once_the_quiet_mark_runs_out(
        reader: Flask, writer: Flask, auth: dict[str, str]) -> None:
    _services(writer).timeline.count_writes = (  # type: ignore[method-assign]
        lambda topic_uid, written: None)
    topic, other, waiting, out = _unheralded(reader, writer, auth, wait_ms=20_000)
    time.sleep(1.5)
    _arrives_within(COUNTED_AHEAD_MS + _services(reader).config.pull_idle_ms, topic, other,
                    waiting, out)


def test_the_read_a_wake_up_starts_does_not_first_read_the_write_counts(
        config: Config, writer: Flask, auth: dict[str, str], ready_at_once: None) -> None:
    app = create_app(config.replace(pull_idle_ms=20_000))  # no idle read during the test
    try:
        topic = TopicClient(app.test_client(), auth)
        _until_ready(app, topic)
        # the writer reads where to send after the reader registered (it rereads every 2 s)
        other = TopicClient(writer.test_client(), auth, name=topic.name)
        scans = _counting_scans(_services(app))
        counted = _counting_count_reads(_services(app))
        waiting, out = _waiting(topic, 10_000)
        time.sleep(1)  # the call's read, then one that leaves a quiet mark
        assert len(scans) == 2 and len(counted) == 1, (scans, counted)
        sent_s = time.monotonic()
        assert other.enqueue(id="now").status_code == 201
        waiting.join(10)
        [message] = out["messages"]
        woken = min(s for s in scans if s > sent_s)
        # the mark was dropped by the wake-up, and the read it started went straight to the
        # timeline (reading the counts first would delay the message by a round trip)
        assert [c for c in counted if c > sent_s] == [], (counted, sent_s, woken)
        assert topic.ack(message) == 204
    finally:
        _services(app).close()


def test_the_quiet_topics_of_a_process_are_checked_together_once_an_idle_period(
        reader: Flask, writer: Flask, auth: dict[str, str]) -> None:
    topics = [TopicClient(reader.test_client(), auth) for _ in range(5)]
    others = [TopicClient(writer.test_client(), auth, name=t.name) for t in topics]
    _services(writer).pull_wakes.tell = lambda topic_uid: None  # type: ignore[method-assign]
    _until_ready(reader, topics[0])
    calls = [_waiting(t, 15_000) for t in topics]
    time.sleep(1.5)  # each call's read, then one that leaves a quiet mark
    services = _services(reader)
    scans = _counting_scans(services)
    alone = _counting_count_reads(services)
    together = _recording_starts(services.quiet_watch, "read_counts")
    time.sleep(4)
    # while the marks stand (about 9 s): no timeline read and no topic's counts read alone,
    # but one read of them all each idle period (two if the marks straddle a bucket's end)
    assert scans == [] and alone == [], (scans, alone)
    assert 3 <= len(together) <= 10, together
    # its wake-up lost, its count not: the check after the write finds it moved
    _arrives_within(services.config.pull_idle_ms + 500, topics[2], others[2], *calls[2])
    assert all(thread.is_alive() for n, (thread, _) in enumerate(calls) if n != 2)
    for thread, _ in calls:
        thread.join(20)
