"""Releasers against the real node: webhook push to real local HTTP servers, retries, dead
letters, isolation of slow targets, pull cursors kept moving, graceful stop."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.config import Config
from app.core.timeline import COUNTED_AHEAD_MS, shard_of
from app.core.timeparse import parse_instant
from app.errors import StoreUnavailable
from app.messages.placement import PointerPlacer
from app.services import Services
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving
from tests.releasing import (
    FAST,
    assert_on_time_and_signed,
    keyspace_alone,
    releaser,
    tenant_of,
    wait_served,
    wait_state,
    webhook_topic,
)
from tests.test_metrics import scrape
from tests.waiting import wait_until
from workers import push as push_module
from workers import releaser as releaser_module
from workers.count_reads import read_counts
from workers.held import HeldMessages
from workers.push import PushDispatcher
from workers.releaser import Releaser
from workers.walk import Walk


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in rec.getMessage() for rec in caplog.records)


def test_webhook_delivers_each_message_once_on_time_signed(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    with receiving(Receiver()) as target, releaser(config, "r-once") as r:
        topic, secret = webhook_topic(client, auth, target.url)
        start = now_ms() + 800
        sent = topic.batch([{"id": f"m{i}", "deliver_at": start + (i % 40) * 50,
                             "payload": {"i": i}} for i in range(400)])
        assert all(r["status"] == 201 for r in sent)
        assert target.wait_for(lambda got: len({a.message_id for a in got}) == 400, 30)
        time.sleep(0.5)  # anything delivered twice would show up now
        counts = Counter(target.ids())
        assert set(counts) == {f"m{i}" for i in range(400)}
        assert max(counts.values()) == 1
        assert_on_time_and_signed(target.arrivals, secret, topic.name)
        first = target.arrivals[0]
        assert first.headers["Content-Type"] == "application/json"
        assert first.headers["Duetime-Attempt"] == "1"
        body = wait_state(topic, "m7", "delivered", 5)
        assert body["attempts"] == 1
        r.services.lag.flush()
        lag = client.get(topic.url("/lag?minutes=3"), headers=auth).get_json()["minutes"]
        assert sum(m["count"] for m in lag) == 400  # one POST start each


def test_target_failing_twice_gets_the_message_three_times_then_delivered(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    def script(message_id: str, before: int) -> int:
        return 500 if before < 2 else 200

    with receiving(Receiver(script)) as target, releaser(config, "r-retry"):
        topic, secret = webhook_topic(client, auth, target.url,
                                      retry={"backoff_seconds": 0.2, "max_backoff_seconds": 1})
        assert topic.enqueue(id="flaky", delay_ms=300).status_code == 201
        body = wait_state(topic, "flaky", "delivered", 15)
        assert target.ids() == ["flaky"] * 3
        assert [a.headers["Duetime-Attempt"] for a in target.arrivals] == ["1", "2", "3"]
        assert body["attempts"] == 3
        assert_on_time_and_signed(target.arrivals, secret, topic.name)
        # retries come back no earlier than half the backoff (equal jitter)
        times = [a.received_ms for a in target.arrivals]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert gaps[0] >= 100 and gaps[1] >= 200, gaps


def test_target_that_always_fails_makes_the_message_dead_with_its_error(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    with receiving(Receiver(lambda message_id, before: 503)) as target, \
            releaser(config, "r-dead"):
        topic, _ = webhook_topic(client, auth, target.url, max_attempts=3,
                                 retry={"backoff_seconds": 0.1, "max_backoff_seconds": 0.2})
        assert topic.enqueue(id="doomed").status_code == 201
        body = wait_state(topic, "doomed", "dead", 15)
        time.sleep(0.5)
        assert target.ids() == ["doomed"] * 3
        assert body["attempts"] == 3
        assert "HTTP 503" in body["last_error"]
        [listed] = client.get(topic.url("/dead-letters"), headers=auth).get_json()["messages"]
        assert (listed["id"], listed["last_error"]) == ("doomed", body["last_error"])


def test_unreachable_target_is_retried_and_kept_as_last_error(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    with releaser(config, "r-refused"):
        topic, _ = webhook_topic(client, auth, "http://127.0.0.1:9/nothing-listens",
                                 max_attempts=2, retry={"backoff_seconds": 0.1})
        assert topic.enqueue(id="nowhere").status_code == 201
        body = wait_state(topic, "nowhere", "dead", 15)
        assert "refused" in body["last_error"], body["last_error"]


def test_slow_target_does_not_hold_up_another_topic(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    gate = threading.Event()
    with receiving(Receiver(gate=gate)) as slow, receiving(Receiver()) as fast, \
            releaser(config, "r-isolation"):
        stuck, _ = webhook_topic(client, auth, slow.url)
        quick, _ = webhook_topic(client, auth, fast.url)
        assert {r["status"] for r in stuck.batch(
            [{"id": f"s{i}", "delay_ms": 200} for i in range(200)])} == {201}
        assert {r["status"] for r in quick.batch(
            [{"id": f"q{i}", "delay_ms": 400} for i in range(50)])} == {201}
        try:
            # every POST to the slow target is held open, yet the other topic is served
            fast.wait_for(lambda got: len(got) >= 50, 20)
            assert sorted(Counter(fast.ids()).values()) == [1] * 50, Counter(fast.ids())
            assert slow.arrivals == []
        finally:
            gate.set()
        assert slow.wait_for(lambda got: len({a.message_id for a in got}) == 200, 30)


def test_leasing_a_webhook_topic_is_a_conflict(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, delivery={"mode": "webhook", "url": "http://x.invalid/"})
    answer = client.post(topic.url("/leases"), json={"max": 1}, headers=auth)
    assert answer.status_code == 409
    assert answer.mimetype == "application/problem+json"


def test_releaser_moves_pull_cursors_over_spent_pointers(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, shards=2)
    assert {r["status"] for r in topic.batch([{"id": f"p{i}"} for i in range(30)])} == {201}
    uid = services.topics.get(tenant_of(services, auth), topic.name).uid
    before = services.timeline.cursors(uid)

    def moved_past_acks() -> bool:
        after = services.timeline.cursors(uid)
        return set(after) == {0, 1} and all(
            t > before.get(s, 0) and t >= acked_at - config.safety_lag_ms
            for s, t in after.items())

    with releaser(config, "r-cursors"):
        wait_served(client, auth, topic.name)
        assert len(topic.drain(30, within_s=15)) == 30  # leased through the releaser
        acked_at = now_ms()
        # cursors move in steps of CURSOR_STEP_MS, never past now - safety lag
        deadline = time.monotonic() + 15
        while not moved_past_acks() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert moved_past_acks(), services.timeline.cursors(uid)


@contextmanager
def late_producer(label: str, member: str, behind_ms: int
                  ) -> Iterator[tuple[Receiver, TopicClient, str, Flask]]:
    """A webhook topic that releaser `member`'s walk has read past its creation, and a
    client of it from a producer whose clock is behind_ms behind: (its target, that client,
    the topic's signing secret, the producer's app). In a keyspace of its own: in the
    shared one a new releaser's first steps work through every topic the tests before left.
    behind_ms must exceed the time the walk takes to pass the topic's creation plus the
    safety lag: a write less far behind lands ahead of the positions."""
    with keyspace_alone(label) as (config, services, client, auth):
        skewed = create_app(config, clock=lambda: now_ms() - behind_ms)
        try:
            with receiving(Receiver()) as target, releaser(config, member) as r:
                topic, secret = webhook_topic(client, auth, target.url)
                made = now_ms()
                uid = services.topics.get(tenant_of(services, auth), topic.name).uid
                assert wait_until(lambda: (w := r._walks.get(uid)) is not None
                                  and w.read_at is not None
                                  and min(w.position.values()) > made, 10)
                assert_written_behind_its_cursors(config, made, behind_ms)
                yield target, TopicClient(skewed.test_client(), auth, name=topic.name,
                                          delivery={"mode": "webhook", "url": target.url}), \
                    secret, skewed
        finally:
            skewed.extensions["duetime"].close()


def assert_written_behind_its_cursors(config: Config, made_ms: int, behind_ms: int) -> None:
    """A write from now by a producer behind_ms behind lands behind the walk's positions in
    a topic made at made_ms, with 2 s to spare for the write: else a test of a straggler
    would test none."""
    assert now_ms() - made_ms < behind_ms - config.safety_lag_ms - 2000


def test_a_pointer_written_far_behind_the_cursor_is_still_delivered() -> None:
    """A producer whose clock is 20 s behind (twenty times the safety lag) writes a pointer
    the walk has long passed. Its process keeps the cluster's time (its clock corrected by
    its measured offset to Cassandra's, app.ops.cluster_clock), so it finds its write late
    and places the pointer again, due now, where the walk reads it."""
    with late_producer("behind", "r-behind", 20_000) as (target, late, secret, _):
        assert late.enqueue(id="behind").status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 30)
        assert_on_time_and_signed(target.arrivals, secret, late.name)


def test_a_message_whose_take_failed_is_read_again_and_delivered(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The take (lease pointer, conditional batch) of a message the walk has passed fails
    once: the broker keeps holding it and its next round takes it again, so it is POSTed on
    time, not left scheduled behind the walk's position and the cursor."""
    failures: list[str] = []
    take = PushDispatcher._take

    def failing_once(self: PushDispatcher, topic: Any, keep: list[Any]) -> Any:
        # only this test's message: a slow earlier test may leave others of the keyspace due
        if not failures and [d.pointer.id for d in keep] == ["retaken"]:
            failures.extend(d.pointer.id for d in keep)
            raise StoreUnavailable("Cassandra unavailable: WriteTimeout")
        return take(self, topic, keep)

    monkeypatch.setattr(PushDispatcher, "_take", failing_once)
    with receiving(Receiver()) as target:
        topic, secret = webhook_topic(client, auth, target.url)
        with releaser(config, "r-take-failed"):
            assert topic.enqueue(id="retaken", delay_ms=1500).status_code == 201
            assert target.wait_for(lambda got: len(got) == 1, 15), target.ids()
    assert failures == ["retaken"] and target.ids() == ["retaken"]
    assert_on_time_and_signed(target.arrivals, secret, topic.name)


def test_a_push_whose_take_was_left_undecided_is_read_again_and_delivered(
        config: Config, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The take of a webhook message whose lease pointer could not be written (a node
    down) leaves it scheduled and its pointer unspent, without an error: the walk, which
    has passed it, reads it again, so it is taken again and POSTed, not left behind."""
    with receiving(Receiver()) as target, releaser(config, "r-undecided") as r:
        topic, secret = webhook_topic(client, auth, target.url)
        place = r.services.placer.place
        failed: list[str] = []

        def failing_lease_pointer(topic_uid: uuid.UUID, pointers: Any, *args: Any,
                                  **kwargs: Any) -> Any:
            if not failed and any(p.id == "undecided" and p.version == 2 for p in pointers):
                failed.extend(p.id for p in pointers)
                return [StoreUnavailable("Cassandra unavailable: WriteTimeout")] * len(pointers)
            return place(topic_uid, pointers, *args, **kwargs)

        monkeypatch.setattr(r.services.placer, "place", failing_lease_pointer)
        assert topic.enqueue(id="undecided", delay_ms=1500).status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 15), target.ids()
    assert failed == ["undecided"] and target.ids() == ["undecided"]
    assert_on_time_and_signed(target.arrivals, secret, topic.name)


def test_what_was_held_of_a_slot_whose_lease_was_not_confirmed_in_time_is_read_again(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A releaser whose slot renewals are slow (a node down) may not take messages of the
    slot for a moment (SlotOwnership.may_take says no): the broker lets go of what it held
    there, and the walk, which has passed it, reads it again, so the message is POSTed once
    the lease is confirmed."""
    with receiving(Receiver()) as target, releaser(config, "r-unconfirmed") as r:
        topic, secret = webhook_topic(client, auth, target.url)
        stored = services.topics.get(tenant_of(services, auth), topic.name)
        slot = r._slots_of(stored)[shard_of("unconfirmed", stored.settings.shards)]
        may_take = r.ownership.may_take
        refused: list[int] = []

        def unconfirmed_once(asked: int) -> bool:
            if asked == slot and not refused and any(
                    d.pointer.id == "unconfirmed" for d in r.broker.held_of(stored.uid)):
                refused.append(asked)
                return False
            return may_take(asked)

        monkeypatch.setattr(r.ownership, "may_take", unconfirmed_once)
        assert topic.enqueue(id="unconfirmed", delay_ms=1500).status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 15), target.ids()
    assert refused == [slot] and target.ids() == ["unconfirmed"]
    assert_on_time_and_signed(target.arrivals, secret, topic.name)


def test_a_late_write_whose_placing_again_fails_once_is_placed_again_and_delivered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pointer written late (here by a producer 20 s behind) is placed again; when that
    write fails, it is tried again (PointerPlacer.again_if_late), so the message is not left
    behind the walk's position."""
    failures: list[str] = []
    with late_producer("againfailed", "r-again-failed", 20_000) as (target, late, _, skewed):
        placer: PointerPlacer = skewed.extensions["duetime"].placer
        place = placer.place

        def failing_once(topic_uid: uuid.UUID, pointers: Any, now_ms: int, *args: Any,
                         **kwargs: Any) -> Any:
            # the first write at the cluster's time (the producer's own are 20 s behind)
            if not failures and now_ms > time.time() * 1000 - 5000:
                failures.extend(p.id for p in pointers)
                raise StoreUnavailable("Cassandra unavailable: WriteTimeout")
            return place(topic_uid, pointers, now_ms, *args, **kwargs)

        monkeypatch.setattr(placer, "place", failing_once)
        assert late.enqueue(id="behind").status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 30)
        assert failures == ["behind"] and target.ids() == ["behind"]


def test_a_write_that_lands_late_is_placed_again_and_delivered(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A pointer whose write lands 3 s after its due time (a node kill's retries, a pause),
    behind the walk's position and past the safety lag its re-read of a moved count covers:
    its writer finds the write late and places it again, due now, and the message is
    delivered (without that, it would wait behind the position for good)."""
    writer: Services = client.application.extensions["duetime"]  # the API's, which enqueues
    write_pointers = writer.timeline.write_pointers
    slowed: list[int] = []

    def landing_late(topic_uid: uuid.UUID, placed: Any) -> Any:
        if not slowed:
            slowed.append(len(placed))
            time.sleep(3)  # the walk reads on past it meanwhile (every 1.5 s here)
        return write_pointers(topic_uid, placed)

    with receiving(Receiver()) as target, releaser(config, "r-landed-late") as r:
        topic, secret = webhook_topic(client, auth, target.url)
        uid = services.topics.get(tenant_of(services, auth), topic.name).uid
        wake_walk_until(r, lambda: (w := r._walks.get(uid)) is not None
                        and w.read_at is not None, 10)
        monkeypatch.setattr(writer.timeline, "write_pointers", landing_late)
        with caplog.at_level(logging.INFO, logger="app.messages.placement"):
            assert topic.enqueue(id="landed-late").status_code == 201
            assert slowed == [1]
            assert target.wait_for(lambda got: len(got) == 1, 10), target.ids()
        assert logged(caplog, "their write finished late")
    assert target.ids() == ["landed-late"]
    assert_on_time_and_signed(target.arrivals, secret, topic.name)


@pytest.mark.parametrize("given_back", [True, False], ids=["given-back", "give-back-failed"])
def test_a_push_not_posted_is_given_back_due_at_its_leases_end_its_attempt_not_counted(
        config: Config, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch, given_back: bool) -> None:
    """A POST not sent (its lease was about to run out: queued behind a slow target, or a
    slow take during a node kill) is given back: scheduled again, due when its lease would
    have ended, its attempt not counted, since nothing was sent. On a topic of max_attempts
    1 it is then delivered; counted, the take at its lease's end would make it dead. When
    the give-back fails, its lease pointer, which the walk passed while it counted as spent
    (a 6 s lease's lies within a 9 s look-ahead), is read again: it comes due at its lease's
    end all the same, that attempt counted."""
    if not given_back:
        monkeypatch.setattr(push_module, "give_back", lambda services, topic, items: [])
    with receiving(Receiver()) as target, releaser(config, "r-not-posted",
                                                   release_lookahead_ms=9000) as r:
        topic = TopicClient(client, auth, delivery={"mode": "webhook", "url": target.url,
                                                    "timeout_seconds": 1},
                            max_attempts=1 if given_back else 2)
        send = r.push._send
        skipped: list[str] = []

        def skipping_first(armed: list[Any]) -> None:
            # only this test's message: a slow earlier test may leave others of the keyspace due
            if skipped or [a.row.id for a in armed] != ["unposted"]:
                return send(armed)
            skipped.extend(a.row.id for a in armed)
            time.sleep(1)  # the walk reads the lease pointer meanwhile
            r.push._not_posted(armed)  # as the POST process's "not posted" answer does

        monkeypatch.setattr(r.push, "_send", skipping_first)
        dropped_at = now_ms()
        assert topic.enqueue(id="unposted", delay_ms=1000).status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 20), target.ids()
        assert wait_until(lambda: topic.get("unposted").get_json()["state"] == "delivered",
                          10, 0.1), topic.get("unposted").get_json()
        assert topic.get("unposted").get_json()["attempts"] == (1 if given_back else 2)
    assert skipped == ["unposted"] and target.ids() == ["unposted"]
    assert target.arrivals[0].received_ms >= dropped_at + 1000 + 6000  # at its lease's end


def test_a_stop_ends_every_thread_of_the_releaser_when_its_runs_overrun(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A releaser whose runs overrun (a walk step of a crowded keyspace on a slow machine:
    here 60 topics at 1 s each, 8 at a time; the schedules job 2 s a tick) still stops within
    its bound: queued work is cancelled, the runs under way end, and every thread it
    started has ended, so nothing goes on working once its services are closed."""
    started: list[int] = []

    def slow_walk(self: Releaser) -> None:
        def one(n: int) -> None:
            started.append(n)
            time.sleep(1)
        releaser_module.all_done([self._readers.submit(one, n) for n in range(60)])

    monkeypatch.setattr(Releaser, "walk", slow_walk)
    monkeypatch.setattr(Releaser, "produce_fires", lambda self: time.sleep(2))
    before = set(threading.enumerate())
    services = Services(config.replace(**FAST))
    r = Releaser(services, "r-overrun")
    r.start()
    try:
        assert wait_until(lambda: len(started) >= 8, 30), started
    finally:
        began = time.monotonic()
        r.stop()
        stopped_s = time.monotonic() - began
        services.close()
    assert stopped_s < releaser_module.STOP_RUNS_S, stopped_s
    assert len(started) < 30, f"queued walk work ran after the stop: {len(started)} of 60"
    assert wait_until(lambda: not [t for t in threading.enumerate()
                                   if t not in before and t.is_alive()], 10), \
        [t.name for t in threading.enumerate() if t not in before]


def test_stopping_finishes_the_posts_in_flight() -> None:
    """What SIGTERM does (workers.releaser.run_forever calls stop()): POSTs already sent are
    waited for and their outcome recorded, so nothing is sent twice by the next owner. In a
    keyspace of its own: in the shared one a new releaser's first runs work through what
    earlier tests left (a slow machine's had sent none of the POSTs after 10 s)."""
    gate = threading.Event()
    with keyspace_alone("graceful") as (config, _, client, auth), \
            receiving(Receiver(gate=gate)) as target:
        services = Services(config.replace(**FAST))
        r = Releaser(services, "r-graceful")
        r.start()
        stopper = threading.Thread(target=r.stop)
        try:
            topic, _ = webhook_topic(client, auth, target.url)
            assert {x["status"] for x in topic.batch(
                [{"id": f"g{i}", "delay_ms": 300} for i in range(5)])} == {201}
            # the POSTs are out, held open by the gate
            assert wait_until(lambda: target.started == 5, 30), target.started
            stopper.start()
            time.sleep(0.5)
            assert stopper.is_alive()  # stop() waits for the POSTs in flight
        finally:
            gate.set()
            if stopper.ident is not None:  # started: it ends once the POSTs are answered
                stopper.join(30)
            else:
                r.stop()
            services.close()
        assert not stopper.is_alive()
        for i in range(5):
            assert topic.get(f"g{i}").get_json()["state"] == "delivered"
        with releaser(config, "r-after"):
            time.sleep(2)  # a new owner finds nothing left to send
        assert sorted(target.ids()) == [f"g{i}" for i in range(5)]


def test_a_webhook_topic_created_a_moment_ago_is_delivered_on_time() -> None:
    """The releaser read every topic before this one existed and will not read them all
    again for ten minutes (FAST): it learns of the new topic, and of a change of its
    target, from topic_changes. In a keyspace of its own: in the shared one the releaser's
    first runs work through what earlier tests left."""
    with keyspace_alone("newtopic") as (config, _, client, auth), \
            receiving(Receiver()) as target, releaser(config, "r-new-topic") as r:
        time.sleep(0.5)
        topic, _ = webhook_topic(client, auth, target.url)
        assert topic.enqueue(id="first", delay_ms=200).status_code == 201
        assert target.wait_for(lambda got: len(got) >= 1, 10)
        state = (f"owned {len(r.ownership.owned())} of {config.release_slots} slots, "
                 f"runs (woken) {[(s.name, s.runs, s.woken_runs) for s in r.paced]}")
        moved = client.put(topic.url(), headers=auth, json={"delivery": {
            "mode": "webhook", "url": target.url.rstrip("/") + "/moved", "timeout_seconds": 5}})
        assert moved.status_code == 200, moved.get_json()
        time.sleep(0.5)
        assert topic.enqueue(id="second", delay_ms=200).status_code == 201
        assert target.wait_for(lambda got: len(got) >= 2, 10)
    first, second = target.arrivals[:2]
    lag = first.received_ms - parse_instant(first.headers["Duetime-Deliver-At"])
    assert 0 <= lag < 1000, (lag, state)  # not the ten minutes of a full re-read
    assert second.message_id == "second"  # to the target the change named
    assert second.path.endswith("/moved") and not first.path.endswith("/moved")


def cursor_reads(r: Releaser, together: list[set[uuid.UUID]] | None = None
                 ) -> list[uuid.UUID]:
    """The topics whose cursors the releaser reads from now on, one entry per topic read
    (alone or with others); and into `together`, the topics of each read of many."""
    reads: list[uuid.UUID] = []
    cursors, cursors_of = r.services.timeline.cursors, r.services.timeline.cursors_of

    def counting(topic_uid: uuid.UUID) -> dict[int, int]:
        reads.append(topic_uid)
        return cursors(topic_uid)

    def counting_of(topic_uids: list[uuid.UUID]) -> dict[uuid.UUID, dict[int, int]]:
        reads.extend(topic_uids)
        if together is not None:
            together.append(set(topic_uids))
        return cursors_of(topic_uids)

    r.services.timeline.cursors = counting  # type: ignore[method-assign]
    r.services.timeline.cursors_of = counting_of  # type: ignore[method-assign]
    return reads


def walk_reads(r: Releaser, shards: list[tuple[uuid.UUID, int, float]] | None = None
               ) -> list[uuid.UUID]:
    """The topics whose partitions the releaser's walk reads from now on, one entry per
    read; `shards`, when given, gets (topic, shard, monotonic s) for each shard a read
    covers."""
    reads: list[uuid.UUID] = []
    upcoming = r.services.scanner.upcoming

    def counting(topic: Any, starts: dict[int, int], *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("walk"):
            reads.append(topic.uid)
            if shards is not None:
                shards.extend((topic.uid, s, time.monotonic()) for s in starts)
        return upcoming(topic, starts, *args, **kwargs)

    r.services.scanner.upcoming = counting  # type: ignore[method-assign]
    return reads


def run_walk(r: Releaser, times: int) -> None:
    """Wake the walk until it has run `times` more steps."""
    until = r._walking.runs + times
    wake_walk_until(r, lambda: r._walking.runs >= until)


def wake_walk_until(r: Releaser, done: Callable[[], bool], within_s: float = 5) -> None:
    """Wake the walk every 50 ms until done() holds, which must happen within_s."""
    deadline = time.monotonic() + within_s
    while not done() and time.monotonic() < deadline:
        r._walking.wake()
        time.sleep(0.05)
    assert done()


def test_the_walk_reads_only_the_webhook_topics_written_to_since_it_last_read_them() -> None:
    """Active webhook topics whose write counts have not moved cost the walk no read of their
    partitions while their positions are far from the window's end; a write to one makes it
    read that one, and everything is delivered. A keyspace alone: in the shared one, what
    earlier tests left due keeps the walk's steps reading dozens of other topics."""
    with keyspace_alone("written") as (config, services, client, auth), \
            receiving(Receiver()) as target:
        topics = [webhook_topic(client, auth, target.url)[0] for _ in range(3)]
        uids = [services.topics.get(tenant_of(services, auth), t.name).uid for t in topics]
        for n, topic in enumerate(topics):
            assert topic.enqueue(id=f"ahead{n}", delay_ms=8000).status_code == 201
        # a window of 9 s: all is read and compared long before a message is taken
        with releaser(config, "r-walk", release_lookahead_ms=9000) as r:
            reads = walk_reads(r)
            # each read once: its message is in the window
            wake_walk_until(r, lambda: set(uids) <= set(reads))
            reads.clear()
            run_walk(r, 5)
            assert not set(uids) & set(reads)  # nothing written since
            assert topics[0].enqueue(id="more", delay_ms=6000).status_code == 201
            # due beyond the writer's look-ahead: no wake-up names it, the next pass over
            # every topic finds its count moved
            time.sleep(releaser_module.PASS_EVERY_MS / 1000)
            run_walk(r, 3)
            assert uids[0] in reads and not {uids[1], uids[2]} & set(reads)
            assert target.wait_for(lambda got: len(got) >= 4, 15)
    assert sorted(target.ids()) == ["ahead0", "ahead1", "ahead2", "more"]
    for a in target.arrivals:
        assert a.received_ms >= parse_instant(a.headers["Duetime-Deliver-At"]), a


def walk_count_reads(r: Releaser) -> list[set[uuid.UUID]]:
    """The topics each of the walk's write-count reads asks for, from now on."""
    asked: list[set[uuid.UUID]] = []
    write_counts_in = r.services.timeline.write_counts_in

    def counting(groups: Any) -> Any:
        if threading.current_thread().name.startswith("walk"):  # not a broker's read_now
            asked.append({uid for uids, _ in groups for uid in uids})
        return write_counts_in(groups)

    r.services.timeline.write_counts_in = counting  # type: ignore[method-assign]
    return asked


def test_a_step_woken_for_a_topic_reads_the_counts_of_that_topic_alone(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A due wake-up names the topic written: the walk's woken steps read that topic's
    counts, not those of every active topic (a crowded keyspace's hundreds, every 50 ms).
    The passes over every topic are put off here, so only the wake-up explains the reads."""
    monkeypatch.setattr(releaser_module, "PASS_EVERY_MS", 3_600_000)
    with receiving(Receiver()) as target:
        topics = [webhook_topic(client, auth, target.url)[0] for _ in range(3)]
        uids = [services.topics.get(tenant_of(services, auth), t.name).uid for t in topics]
        for n, topic in enumerate(topics):
            assert topic.enqueue(id=f"ahead{n}", delay_ms=30_000).status_code == 201
        with releaser(config, "r-named") as r:  # its first steps look at every topic
            reads = walk_reads(r)
            wake_walk_until(r, lambda: set(uids) <= set(reads))
            assert wait_until(lambda: not r._walking.warming(), releaser_module.WARM_MS / 1000)
            asked = walk_count_reads(r)
            assert topics[0].enqueue(id="soon", delay_ms=1000).status_code == 201
            assert target.wait_for(lambda got: "soon" in [a.message_id for a in got], 10)
    # a pass over every topic (a slot claimed late) would ask for all three
    times = [sum(uid in topics_asked for topics_asked in asked) for uid in uids]
    assert times[0] > max(times[1], times[2]), times
    soon = next(a for a in target.arrivals if a.message_id == "soon")
    assert soon.received_ms >= parse_instant(soon.headers["Duetime-Deliver-At"])


def test_a_drained_topic_is_read_once_every_few_steps_not_at_every_one() -> None:
    """A drained topic stays listed active while its buckets are in the window, its counts
    standing: its shards are read on only as their positions near the horizon (now +
    look-ahead), and each read goes on to the reach (now + COUNTED_AHEAD_MS less the safety
    lag): a quiet shard is read every 5.5 s with the defaults, so once or twice in 8 s of
    steps (several times, were reads to stop at the horizon). Counted per shard: the shard
    the delivery wrote to was last read later than the others, and when that was more than
    a pass later, its reads and theirs fall in different steps. A keyspace alone, so no other
    topic keeps the walk's steps busy."""
    with keyspace_alone("drained") as (config, services, client, auth), \
            receiving(Receiver()) as target:
        topic, _ = webhook_topic(client, auth, target.url)
        stored = services.topics.get(tenant_of(services, auth), topic.name)
        assert stored is not None
        uid = stored.uid
        with releaser(config, "r-drained") as r:
            shard_reads: list[tuple[uuid.UUID, int, float]] = []
            walk_reads(r, shard_reads)
            assert topic.enqueue(id="drained").status_code == 201
            assert target.wait_for(lambda got: len(got) == 1, 10)
            wait_state(topic, "drained", "delivered", 10)

            def counts_read() -> bool:  # every count the delivery's writes moved, read
                walk = r._walks.get(uid)
                window = r._span(now_ms())[2]
                counts = read_counts(services.timeline, {uid: window}).get(uid, {})
                return walk is not None and walk.read_at is not None and not walk.moved(counts)

            wake_walk_until(r, counts_read, within_s=15)
            shard_reads.clear()
            began = time.monotonic()
            while time.monotonic() < began + 8:
                r._walking.wake()
                time.sleep(0.05)
            assert uid in services.timeline.active_topics(r._span(now_ms())[2])
            # the only releaser owns every slot: a walk of fewer shards would leave the
            # assertion below nothing to count
            assert r._walks[uid].shards == frozenset(range(stored.settings.shards))
    times: dict[int, list[float]] = {s: [] for s in range(stored.settings.shards)}
    for topic_uid, shard, at in shard_reads:
        if topic_uid == uid:
            times[shard].append(round(at - began, 2))
    assert all(1 <= len(at) <= 2 for at in times.values()), times


def test_a_pass_looks_at_a_turn_of_the_quiet_topics_not_at_every_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of the walk looks at the topics with pointers in its window and at a turn of
    the quiet ones: each quiet topic once in QUIET_TURNS passes, every one of them in that
    many, so a pass costs the releaser the active topics, not every topic it knows. A
    keyspace alone, so its 12 topics are the only ones; every step a pass."""
    monkeypatch.setattr(releaser_module, "QUIET_TURNS", 4)
    monkeypatch.setattr(releaser_module, "PASS_EVERY_MS", 0)
    with keyspace_alone("quiet") as (config, services, client, auth):
        topics = [TopicClient(client, auth) for _ in range(12)]
        uids = {services.topics.get(tenant_of(services, auth), t.name).uid for t in topics}
        with releaser(config, "r-quiet") as r:
            wake_walk_until(r, lambda: uids <= set(r._walks), 20)  # the first, full pass
            looked: Counter[uuid.UUID] = Counter()
            passes = 0
            turn_of = r._passed

            def passed(active: set[uuid.UUID]) -> list[Any]:
                nonlocal passes
                passes += 1
                chosen = turn_of(active)
                looked.update(t.uid for t in chosen if t.uid in uids)
                return chosen

            monkeypatch.setattr(r, "_passed", passed)
            run_walk(r, 8)
    assert passes >= 8, passes
    turns = -(-passes // 4)
    assert set(looked) == uids, looked  # none left out of its turn
    assert max(looked.values()) <= turns, (looked, passes)  # not at every pass


def test_the_walk_reads_a_topic_it_never_read_before_those_it_reads_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Of the topics a step of the walk must read, the ones it never read come first: a topic
    made a moment ago may have a message due in 200 ms, and in a retry storm it waited its
    turn among a hundred topics whose counts keep moving. One reader, so the order shows."""
    monkeypatch.setattr(releaser_module, "WALK_READERS", 1)
    with keyspace_alone("newfirst") as (config, services, client, auth), \
            receiving(Receiver()) as target:
        tenant = tenant_of(services, auth)
        old = [webhook_topic(client, auth, target.url)[0] for _ in range(8)]
        old_uids = {services.topics.get(tenant, t.name).uid for t in old}
        for n, topic in enumerate(old):
            assert topic.enqueue(id=f"old{n}", delay_ms=8000).status_code == 201
        with releaser(config, "r-new-first", release_lookahead_ms=9000) as r:
            reads: list[tuple[int, uuid.UUID]] = []  # (the walk's step, topic read)
            holding, held, go = threading.Event(), threading.Event(), threading.Event()
            upcoming = r.services.scanner.upcoming

            def holdable(topic: Any, *args: Any, **kwargs: Any) -> Any:
                if threading.current_thread().name.startswith("walk"):
                    if holding.is_set():  # this run waits here until the test lets it go
                        holding.clear()
                        held.set()
                        go.wait(30)
                    reads.append((r._walking.runs, topic.uid))
                return upcoming(topic, *args, **kwargs)

            def read() -> set[uuid.UUID]:
                return {uid for _, uid in reads}

            r.services.scanner.upcoming = holdable  # type: ignore[method-assign]
            wake_walk_until(r, lambda: old_uids <= read())
            holding.set()
            assert old[0].enqueue(id="hold", delay_ms=8000).status_code == 201
            wake_walk_until(r, held.is_set)
            new, _ = webhook_topic(client, auth, target.url)
            new_uid = services.topics.get(tenant, new.name).uid
            assert new.enqueue(id="new", delay_ms=8000).status_code == 201
            deadline = time.monotonic() + 5
            while new_uid not in r._topics and time.monotonic() < deadline:
                time.sleep(0.05)
            assert new_uid in r._topics
            for n, topic in enumerate(old):  # every old topic's count moves
                assert topic.enqueue(id=f"again{n}", delay_ms=8000).status_code == 201
            r._everyone = True  # the next run looks at every topic (a pass over them all)
            go.set()  # the next run reads the new topic and the 8 old ones again
            wake_walk_until(r, lambda: new_uid in read())
            [run] = [k for k, uid in reads if uid == new_uid]
            wake_walk_until(r, lambda: r._walking.runs > run)
            in_run = [uid for k, uid in reads if k == run]
            assert in_run[0] == new_uid and old_uids <= set(in_run), (in_run, new_uid)
            assert target.wait_for(lambda got: len(got) == 18, 20), target.ids()
    assert sorted(target.ids()) == sorted(
        [f"old{n}" for n in range(8)] + [f"again{n}" for n in range(8)] + ["hold", "new"])


def test_a_releaser_back_after_two_days_delivers_what_came_due_meanwhile(
        config: Config, auth: dict[str, str]) -> None:
    """A topic made and written two days ago, by a process whose clock says so, and no
    releaser since: the releaser reads its timeline from cursors that far behind, and they do
    not pass what it has not read."""
    past = create_app(config, clock=lambda: now_ms() - 2 * 86_400_000)
    try:
        with receiving(Receiver()) as target:
            topic, _ = webhook_topic(past.test_client(), auth, target.url)
            assert {r["status"] for r in topic.batch(
                [{"id": f"away{i}"} for i in range(5)])} == {201}
            with releaser(config, "r-back"):
                assert target.wait_for(lambda got: len(got) == 5, 20), target.ids()
            assert sorted(target.ids()) == [f"away{i}" for i in range(5)]
    finally:
        past.extensions["duetime"].close()


def test_a_message_due_while_its_slot_changed_owner_is_read_by_the_new_owners_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A releaser that gives its slots back drops the messages it held for them, and never
    wrote a cursor past them. The new owner's walk starts at the stored cursors, so its first
    step reads what came due meanwhile."""
    with keyspace_alone("handover") as (config, services, client, auth), \
            receiving(Receiver()) as target:
        topic, _ = webhook_topic(client, auth, target.url)
        uid = services.topics.get(tenant_of(services, auth), topic.name).uid
        with releaser(config, "r-old") as old:
            due = now_ms() + 2500
            assert topic.enqueue(id="handed", delay_ms=2500).status_code == 201
            assert wait_until(
                lambda: any(d.pointer.id == "handed" for d in old.broker.held_of(uid)), 2)
        # stopped before the due time: its slots given back, the message still held
        assert target.ids() == []
        time.sleep(max(0.0, (due + 1000 - now_ms()) / 1000))
        with releaser(config, "r-new"):
            assert target.wait_for(lambda got: len(got) == 1, 5), "not read by the new owner"
        assert target.ids() == ["handed"]


def test_the_walk_alone_finds_a_message_due_past_its_window_when_it_was_read(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages written before the walk first read their partitions, due after that read's
    end, are taken when their time comes within the window, though nothing is written to
    their partitions since (one due more than COUNTED_AHEAD_MS after its write moves no count
    at all): the walk reads on from its position as the window moves."""
    with receiving(Receiver()) as target:
        topic, _ = webhook_topic(client, auth, target.url)
        uid = services.topics.get(tenant_of(services, auth), topic.name).uid
        with releaser(config, "r-past-window", release_lookahead_ms=3000) as r:
            reads = walk_reads(r)
            assert topic.enqueue(id="soon", delay_ms=500).status_code == 201
            assert topic.enqueue(id="later", delay_ms=4000).status_code == 201
            assert topic.enqueue(id="uncounted", delay_ms=COUNTED_AHEAD_MS + 2000).status_code \
                == 201
            # read once, "later" then 1 s past the window's end
            wake_walk_until(r, lambda: uid in reads, 3)
            assert target.wait_for(lambda got: len(got) >= 3, 20), target.ids()
    # how late is `make bench`'s verdict (tests.bench.new_topics): it depends on the
    # machine's speed
    assert sorted(target.ids()) == ["later", "soon", "uncounted"]
    for a in target.arrivals:
        assert a.received_ms >= parse_instant(a.headers["Duetime-Deliver-At"]), a.message_id


def test_new_walks_read_their_cursors_together_and_once() -> None:
    """A releaser that learns of many topics at once (its start) starts their walks from
    their durable cursors, read in one request for all, not one a topic; the walk reads them
    no more after that (its positions are in memory). In a keyspace of its own: in the
    shared one a fresh-clone run's first step took over 5 s."""
    with keyspace_alone("cursors") as (config, services, client, auth):
        topics = [TopicClient(client, auth) for _ in range(3)]
        uids = {services.topics.get(tenant_of(services, auth), t.name).uid for t in topics}
        for topic in topics:
            assert topic.enqueue(id="waiting").status_code == 201
        together: list[set[uuid.UUID]] = []
        with releaser(config, "r-cursors", clock=now_ms) as r:  # made after: knows all three
            # until its walks of the three began (a slow node may fail its start's claim or
            # topic read: a later tick does them); then they are started again, counted
            deadline = time.monotonic() + 20
            while not uids <= set(r._walks) and time.monotonic() < deadline:
                r._walking.wake()
                time.sleep(0.05)
            reads = cursor_reads(r, together)
            active_topics = r.services.timeline.active_topics
            forgot = threading.Event()

            def forgetting(window: list[int]) -> set[uuid.UUID]:
                # at a step's start, on its thread: no step sees some walks gone, not all
                if not forgot.is_set():
                    for uid in uids:
                        r._walks.pop(uid, None)
                    r._everyone = True  # as at its start, had the reads been counted then
                    forgot.set()
                return active_topics(window)

            r.services.timeline.active_topics = forgetting  # type: ignore[method-assign]
            deadline = time.monotonic() + 10
            while not forgot.is_set() and time.monotonic() < deadline:
                r._walking.wake()
                time.sleep(0.05)
            runs = r._walking.runs
            while r._walking.runs < runs + 5 and time.monotonic() < deadline:
                r._walking.wake()
                time.sleep(0.05)
            assert r._walking.runs >= runs + 5
    assert any(uids <= c for c in together), together  # all at once
    assert all(reads.count(uid) == 1 for uid in uids), reads  # once


def test_a_deleted_topic_leaves_nothing_in_the_releasers_records(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str]) -> None:
    """What the walk and the broker recorded of a topic goes when the topic is deleted:
    with topics made and deleted all day, those records grew without end."""
    with receiving(Receiver()) as target, releaser(config, "r-forget") as r:
        topic, _ = webhook_topic(client, auth, target.url)
        uid = services.topics.get(tenant_of(services, auth), topic.name).uid
        assert topic.enqueue(id="soon", delay_ms=300).status_code == 201
        assert target.wait_for(lambda got: len(got) == 1, 10)
        assert uid in r._walks  # walked
        assert client.delete(topic.url(), headers=auth).status_code == 204
        deadline = time.monotonic() + 5
        while uid in r._topics and time.monotonic() < deadline:
            time.sleep(0.05)
        assert uid not in r._topics
        assert not {uid} & (set(r._walks) | set(r.broker.held))


def test_a_record_put_back_after_its_topic_was_deleted_is_dropped_by_the_next_topics_step(
        ) -> None:
    """A walk step under way when a topic is deleted may record it again after the topics
    step dropped its records (a race the test above cannot time: records of a topic the
    releaser never knew stand in for it); the topics steps after a deletion drop such
    records, which otherwise stayed for good."""
    with keyspace_alone("putback") as (config, services, client, auth), \
            releaser(config, "r-put-back") as r:
        deleted = TopicClient(client, auth)
        uid = services.topics.get(tenant_of(services, auth), deleted.name).uid
        deadline = time.monotonic() + 5
        while uid not in r._topics and time.monotonic() < deadline:
            time.sleep(0.05)
        assert uid in r._topics
        gone = uuid.uuid4()
        r._walks[gone] = Walk.starting_at({0: 0})
        r.broker.held[gone] = HeldMessages(gone)
        assert client.delete(deleted.url(), headers=auth).status_code == 204
        while uid in r._topics and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        assert uid not in r._topics
        runs = r._following.runs
        while r._following.runs < runs + 2 and time.monotonic() < deadline + 15:
            r._following.wake()
            time.sleep(0.05)
        assert r._following.runs >= runs + 2
        assert not {gone, uid} & (set(r._walks) | set(r.broker.held))


def test_a_releaser_compares_its_clock_with_the_others_and_the_api_reports_the_gap(
        config: Config, app: Flask, services: Services,
        caplog: pytest.LogCaptureFixture) -> None:
    with releaser(config, "clock-ahead", clock_offset_ms=800) as ahead, \
            releaser(config, "clock-true") as true:
        ahead.check_clock()
        with caplog.at_level(logging.WARNING, logger="duetime.clock"):
            true.check_clock()
        assert any("behind releaser clock-ahead" in r.getMessage() for r in caplog.records)
        ready = app.test_client().get("/readyz")
        assert ready.status_code == 200  # a releaser's clock is that releaser's to fix
        assert -800 - 150 <= ready.get_json()["releaser_clock_gap_ms"] <= -800 + 150
        samples = scrape()
        assert -0.95 <= samples[("duetime_clock_releaser_gap_seconds", ())] <= -0.65
    assert not {"clock-ahead", "clock-true"} & set(services.clocks.skews())
