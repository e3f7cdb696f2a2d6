"""Recurring schedules on the real node: bad input, views, every fire exactly once with three
releasers, both misfire rules after all releasers were stopped for 10 s, a replace rewriting
the fires produced, and a delete after which nothing fires. Times are read from the fires
themselves (ids `{name}:{fire ms}`)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.config import Config
from app.core.timeline import schedule_slot_of
from app.core.timeparse import format_ms, parse_instant, parse_local_time
from app.models import MessageState, Topic, TopicSettings
from app.schedules.manage import MISFIRE_GRACE_MS, fire_message, fires_index, produce
from app.services import Services
from app.store.schedules import Schedule
from tests.campaign_helpers import topic_uid
from tests.consumers import TopicClient, now_ms
from tests.releasing import releaser
from workers.schedules import PLAN_MARGIN, ScheduleRunner

EVERY_2S = "*/2 * * * * *"


def _problem(answer: Any, field: str) -> None:
    assert answer.status_code == 400, answer.get_json()
    assert answer.mimetype == "application/problem+json"
    assert field in answer.get_json()["errors"], answer.get_json()


def fires(services: Services, auth: dict[str, str], topic: TopicClient,
          name: str) -> dict[int, MessageState]:
    """Every fire of a schedule produced so far, by fire time."""
    uid = topic_uid(services, auth, topic.name)
    found: dict[int, MessageState] = {}
    after, finished = "", False
    while not finished:
        ids, finished = services.campaigns.members_after(uid, fires_index(name), after, 500)
        for row in services.messages.get_many(uid, ids).values():
            found[int(row.id.rsplit(":", 1)[1])] = row
        after = ids[-1] if ids else after
    return found


@contextlib.contextmanager
def releasers(config: Config, *names: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(releaser(config, name))
        yield


def test_bad_schedules_are_problems_naming_the_field(client: FlaskClient,
                                                     auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    url = topic.url("/schedules/daily")
    _problem(client.put(url, headers=auth, json={"cron": "61 * * * *", "payload": 1}), "cron")
    _problem(client.put(url, headers=auth, json={"cron": "* * *", "payload": 1}), "cron")
    _problem(client.put(url, headers=auth, json={"cron": "0 9 * * *", "payload": 1,
                                                 "timezone": "Mars/Base"}), "timezone")
    _problem(client.put(url, headers=auth, json={"cron": "0 9 * * *", "payload": 1,
                                                 "misfire": "sometimes"}), "misfire")
    _problem(client.put(url, headers=auth, json={"cron": "0 9 * * *"}), "payload")
    _problem(client.put(topic.url("/schedules/Bad!"), headers=auth,
                        json={"cron": "0 9 * * *", "payload": 1}), "schedule")
    assert client.get(url, headers=auth).status_code == 404
    assert client.delete(url, headers=auth).status_code == 404
    # a cancelled campaign takes no fire: accepted, its fires were refused one by one
    assert topic.enqueue(campaign="over", delay_ms=3_600_000).status_code == 201
    assert client.delete(topic.url("/campaigns/over"), headers=auth).status_code == 202
    refused = client.put(url, headers=auth, json={"cron": "* * * * *", "payload": 1,
                                                  "campaign": "over"})
    assert refused.status_code == 409 and refused.mimetype == "application/problem+json"
    assert "cancelled" in refused.get_json()["detail"]
    assert client.get(url, headers=auth).status_code == 404


def test_a_schedule_shows_its_next_fire_times(client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    url = topic.url("/schedules/mornings")
    body = {"cron": "0 9 * * MON-FRI", "timezone": "Europe/Bucharest", "payload": {"n": 1},
            "campaign": "digest"}
    made = client.put(url, headers=auth, json=body)
    assert made.status_code == 201, made.get_json()
    times = [parse_instant(t) for t in made.get_json()["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times) and times[0] > now_ms()
    for t in times:
        local = time.gmtime(t / 1000 + (3 if time.gmtime(t / 1000).tm_mon in range(4, 11)
                                        else 2) * 3600)
        assert (local.tm_hour, local.tm_min, local.tm_wday < 5) == (9, 0, True)
    assert client.put(url, headers=auth, json=body).status_code == 200  # replaced
    assert client.get(url, headers=auth).get_json()["payload"] == {"n": 1}
    listed = client.get(topic.url("/schedules"), headers=auth).get_json()["schedules"]
    assert [s["name"] for s in listed] == ["mornings"]


def test_every_fire_exactly_once_with_three_releasers(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=300)
    assert topic.client.put(topic.url("/schedules/tick"), headers=auth, json={
        "cron": EVERY_2S, "payload": {"tick": True}}).status_code == 201
    with releasers(config, "s1", "s2", "s3"):
        delivered = topic.drain(6, within_s=20)  # checks: never before deliver_at
        time.sleep(2)
    assert client_delete(topic, "tick") == 204
    made = fires(services, auth, topic, "tick")
    times = sorted(made)
    assert len(times) >= 6 and all(b - a == 2000 for a, b in itertools.pairwise(times))
    assert {f"tick:{t}" for t in times} >= delivered
    for t, row in made.items():
        assert row.deliver_at_ms == t  # deliver_at is the fire time


def client_delete(topic: TopicClient, name: str) -> int:
    return topic.client.delete(topic.url(f"/schedules/{name}"),
                               headers=topic.headers).status_code


def test_misfires_after_all_releasers_stopped_for_ten_seconds(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    for name, rule in (("once", "fire_once"), ("skip", "skip")):
        assert topic.client.put(topic.url(f"/schedules/{name}"), headers=topic.headers, json={
            "cron": EVERY_2S, "payload": name, "misfire": rule}).status_code == 201
    with releasers(config, "m1"):
        time.sleep(5)
    stopped = now_ms()
    time.sleep(10)  # no releaser at all
    # Come back 1.05 s after a fire time B: B is then past its grace for certain, and the
    # next fire is 0.95 s away, not a borderline case either way.
    time.sleep((1050 - now_ms() % 2000) % 2000 / 1000)
    restarted = now_ms()
    last_missed = restarted // 2000 * 2000
    with releasers(config, "m2"):
        time.sleep(5)
    for name in ("once", "skip"):
        made = fires(services, auth, topic, name)
        times = sorted(made)
        # fires of the outage made after their own time (past the grace): misfires the rule
        # let through. The fires before and after it come from a releaser just started; when
        # they are made depends on how fast it starts (on a slow day the first releaser made
        # the schedule's first fire past its grace), which is not what this test is about.
        late = [t for t, row in made.items()
                if stopped < t <= restarted and row.created_at_ms > t + MISFIRE_GRACE_MS]
        large = [n for n, (a, b) in enumerate(itertools.pairwise(times)) if b - a > 2000]
        assert len(large) == 1, times  # the outage, and only there
        if name == "once":  # one late fire for all those missed: the latest of them
            assert late == [last_missed] == [times[large[0] + 1]], (late, restarted, times)
        else:
            assert late == [] and last_missed not in made, (restarted, times)
            assert times[large[0] + 1] - times[large[0]] >= 6000, times
        assert client_delete(topic, name) == 204


def test_a_replace_rewrites_waiting_fires_and_a_delete_stops_them(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)  # nobody consumes: fires wait
    url = topic.url("/schedules/beat")
    assert topic.client.put(url, headers=auth, json={"cron": EVERY_2S,
                                                     "payload": "old"}).status_code == 201
    with releasers(config, "d1"):
        time.sleep(5)
        replaced = topic.client.put(url, headers=auth, json={"cron": EVERY_2S,
                                                             "payload": "new"})
        assert replaced.status_code == 200
        waiting = [t for t, r in fires(services, auth, topic, "beat").items()
                   if r.state == "scheduled"]
        assert waiting
        for t in waiting:  # the fires produced before the replace carry the new payload
            assert topic.get(f"beat:{t}").get_json()["payload"] == "new"
        time.sleep(3)
        assert client_delete(topic, "beat") == 204
        deleted = now_ms()
        time.sleep(4)
    after = fires(services, auth, topic, "beat")
    assert all(r.state == "cancelled" for r in after.values()), {
        t: r.state for t, r in after.items()}
    assert max(after) <= deleted + 2000  # nothing produced after the delete
    assert topic.client.get(url, headers=auth).status_code == 404
    assert format_ms(deleted)  # (the time, for a failure message)


def test_a_fire_inside_quiet_hours_is_placed_at_their_end_in_the_schedules_zone() -> None:
    night = Topic("t", "quiet", uuid.uuid4(), TopicSettings(
        quiet_start="21:00", quiet_end="08:00", quiet_timezone="UTC"), "", 0, 0)
    s = Schedule(uuid.uuid4(), "late", "0 22 * * *", "Europe/Bucharest", b"1", "json", 100,
                 None, None, None, "fire_once", 1, None, 0, 0)
    fire = parse_local_time("2027-01-05T22:00:00", "Europe/Bucharest")
    m = fire_message(s, fire, night)
    assert m.id == f"late:{fire}"  # the id names the fire time
    assert m.deliver_at_ms == parse_local_time("2027-01-06T08:00:00", "Europe/Bucharest")
    assert m.requested_ms == fire  # what GET shows as requested_deliver_at
    assert fire_message(s, fire, None).deliver_at_ms == fire
    assert m.content_hash == fire_message(s, fire, night).content_hash  # same for everyone


def test_deleting_a_topic_unlists_its_schedules(app: Flask, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    assert topic.client.put(topic.url("/schedules/orphan"), headers=auth, json={
        "cron": "0 9 * * *", "payload": 1}).status_code == 201
    uid = topic_uid(services, auth, topic.name)
    every_slot = list(range(services.config.release_slots))

    def listed() -> bool:
        return (uid, "orphan") in {(t, n) for _, t, n, _ in services.schedules.in_slots(every_slot)}

    assert listed()
    assert topic.client.delete(topic.url(), headers=auth).status_code == 204
    assert not listed()  # no releaser reads it again


def test_many_schedules_of_a_topic_are_produced_together_and_a_replace_among_them_is_mended(
        app: Flask, auth: dict[str, str]) -> None:
    """produce() of 150 schedules: one of them replaced after it was read, so the conditional
    batch holding its cursor is refused whole; every other cursor still moves (one at a time),
    and the replaced one's fire carries the new payload."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    names = [f"b{n}" for n in range(150)]
    for name in names:
        assert topic.client.put(topic.url(f"/schedules/{name}"), headers=auth, json={
            "cron": "0 0 1 1 *", "timezone": "UTC", "payload": name}).status_code == 201
    uid = topic_uid(services, auth, topic.name)
    read = services.schedules.get_many(uid, names)
    assert sorted(read) == sorted(names)
    soon = (now_ms() // 1000 + 2) * 1000  # a whole second, one to two seconds away
    due = [dataclasses.replace(s, next_fire=soon) for s in read.values()]
    for s in due:  # as if the cursors had come due: a fire at `soon` each
        assert services.schedules.advance(read[s.name], soon)
    assert topic.client.put(topic.url("/schedules/b7"), headers=auth, json={
        "cron": "* * * * * *", "timezone": "UTC", "payload": "new"}).status_code == 200
    found = services.topics.get(services.keys.tenant_of(auth["Authorization"].split()[1]) or "",
                                topic.name)
    assert found is not None
    after = produce(services, found, due)
    now = services.schedules.get_many(uid, names)
    for s, answer in zip(due, after, strict=True):
        assert answer is not None and now[s.name].next_fire == answer.next_fire, s.name
        assert answer.version == (2 if s.name == "b7" else 1)
        assert s.name == "b7" or answer.next_fire != soon, s.name  # moved past its fire
    made = {name: fires(services, auth, topic, name) for name in names}
    assert all(list(f) == [soon] for f in made.values()), made
    assert topic.get(f"b7:{soon}").get_json()["payload"] == "new"  # rewritten after the LWT
    assert topic.get(f"b8:{soon}").get_json()["payload"] == "b8"


def test_a_runner_reads_a_slot_listing_again_only_when_its_mark_moved(
        app: Flask, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    every_slot = frozenset(range(services.config.release_slots))
    runner = ScheduleRunner(services, lambda: every_slot, lambda _uid: None)
    reads: list[list[int]] = []
    in_slots = services.schedules.in_slots

    def counting(slots: list[int]) -> list[tuple[int, uuid.UUID, str, int]]:
        reads.append(slots)
        return in_slots(slots)

    services.schedules.in_slots = counting  # type: ignore[method-assign]
    try:
        runner.tick()
        assert reads and sorted(reads[0]) == sorted(every_slot)  # all new to it
        runner.tick()
        assert len(reads) == 1  # nothing changed: no listing read
        assert topic.client.put(topic.url("/schedules/marked"), headers=auth, json={
            "cron": "0 9 * * *", "payload": 1}).status_code == 201
        runner.tick()
        assert len(reads) == 1  # not woken (app.delivery.wakeups): marks read every MARKS_EVERY_MS
        runner.wake()  # as the datagram the API sent after the listing's write does
        runner.tick()
        uid = topic_uid(services, auth, topic.name)
        slot = schedule_slot_of(str(uid), "marked", services.config.release_slots)
        assert len(reads) == 2 and slot in reads[1]  # its slot, and others changed meanwhile
        assert (uid, "marked") in runner._known
        assert client_delete(topic, "marked") == 204
        runner.wake()
        runner.tick()
        assert (uid, "marked") not in runner._known
    finally:
        del services.schedules.in_slots
        runner.stop()


def test_a_crowd_of_fires_starts_being_made_early_enough_to_be_on_time(app: Flask) -> None:
    """The k-th of the fires close together starts AHEAD_MS + k / rate before its time."""
    services: Services = app.extensions["duetime"]
    runner = ScheduleRunner(services, frozenset, lambda _uid: None)
    fire, uid = 10_000_000, uuid.uuid4()
    try:
        for n in range(1000):
            runner._known[(uid, f"c{n}")] = Schedule(
                uid, f"c{n}", "* * * * *", "UTC", b"1", "json", 100, None, None, None,
                "fire_once", 1, fire, 0, 0)
        runner.rate = 1000.0 * PLAN_MARGIN  # planned at 1,000 fires per second
        assert runner.due(fire - 3001) == []
        assert len(runner.due(fire - 2500)) == 501  # the 500th on, by time
        assert len(runner.due(fire - 2000)) == 1000
        runner._known = {(uid, "c0"): runner._known[(uid, "c0")]}
        assert runner.due(fire - 2002) == [] and len(runner.due(fire - 2001)) == 1
    finally:
        runner.stop()
