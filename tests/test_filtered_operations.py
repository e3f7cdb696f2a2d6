"""Operations on the messages a filter matches (POST /v1/topics/{topic}/operations) on the
real node: a cancel by label and a shift by recipient change exactly the matching messages
(paged, counted), a cancel racing a pull consumer never has a message it counted cancelled
handed out, pause and resume hold back and bring back a slice (or a campaign by its flag),
and bad input is a 400 naming the field.
A runner killed mid-way is in tests/releasers/test_filtered_operations.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flask import Flask

from app.core.timeparse import parse_instant
from app.models import MessageFilter, MessageState
from app.services import Services
from app.store.search import SearchStore
from tests.campaign_helpers import (
    campaign,
    running_operations,
    topic_uid,
    ttl_of,
    wait_operation,
)
from tests.consumers import TopicClient, now_ms
from workers import operations as runner_module

HOUR_MS = 3_600_000


def start(topic: TopicClient, **body: Any) -> Any:
    return topic.client.post(topic.url("/operations"), json=body, headers=topic.headers)


def started(topic: TopicClient, **body: Any) -> dict[str, Any]:
    answer = start(topic, **body)
    assert answer.status_code == 202, answer.get_json()
    op: dict[str, Any] = answer.get_json()["operation"]
    assert answer.headers["Location"].endswith(f"/operations/{op['id']}")
    return op


def rows(services: Services, topic: TopicClient) -> dict[str, MessageState]:
    """Every message row of the topic, by id (through the search's storage order)."""
    uid = topic_uid(services, topic.headers, topic.name)
    found: dict[str, MessageState] = {}
    after = None
    while True:
        page = SearchStore(services.db).find(uid, MessageFilter(), 1000, after)
        found.update((r.id, r) for r in page.rows)
        if page.position is None:
            return found
        after = page.position


@pytest.fixture()
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 7 matches, so that an operation on tens of messages runs many pages."""
    monkeypatch.setattr(runner_module, "FILTER_PAGE", 7)


def test_a_cancel_by_label_cancels_exactly_the_waiting_matches(
        app: Flask, auth: dict[str, str], small_pages: None) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=300)
    later = now_ms() + HOUR_MS
    results = topic.batch(
        [{"id": f"g{n}", "labels": {"tier": "gold"}, "deliver_at": later} for n in range(40)]
        + [{"id": f"f{n}", "labels": {"tier": "free"}, "deliver_at": later} for n in range(30)]
        + [{"id": f"due{n}", "labels": {"tier": "gold"}} for n in range(3)])
    assert {r["status"] for r in results} == {201}
    assert topic.client.delete(topic.url("/messages/g0"), headers=auth).status_code == 204
    held: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while len(held) < 3 and time.monotonic() < deadline:  # handed out, not acked
        held += topic.lease(3 - len(held), wait_ms=500)
    assert sorted(m["id"] for m in held) == ["due0", "due1", "due2"]
    with running_operations(services):
        op = started(topic, kind="cancel", filter={"label": ["tier:gold"]})
        assert op["kind"] == "cancel" and op["campaign"] is None
        assert op["filter"] == {"label": ["tier:gold"]} and op["state"] == "running"
        done = wait_operation(topic, op["id"], 30)
    assert done["state"] == "succeeded", done
    # every gold one looked at; the 39 waiting ones cancelled; the 3 leased ones left
    assert (done["processed"], done["changed"], done["delivering"]) == (43, 39, 3)
    found = rows(services, topic)
    assert {i for i, r in found.items() if r.state == "cancelled"} == {
        f"g{n}" for n in range(40)}
    assert all(found[f"f{n}"].state == "scheduled" for n in range(30))
    assert [topic.ack(m) for m in held] == [204, 204, 204]  # left to their consumer
    stats = topic.client.get(topic.url("/stats"), headers=auth).get_json()["counts"]
    assert stats["cancelled"] == 40 and stats["scheduled"] == 30 and stats["delivered"] == 3


@pytest.mark.parametrize("filter_", [
    {"label": ["tier:gold", "tier:free"]},  # one key, two values: no message has both
    {"due_from": "2027-01-02T00:00:00Z", "due_to": "2027-01-01T00:00:00Z"},
])
def test_a_filter_that_matches_nothing_is_an_operation_that_changes_nothing(
        app: Flask, auth: dict[str, str], filter_: dict[str, Any]) -> None:
    """As the search answers such a filter empty, a cancel with it runs and changes none."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    later = now_ms() + HOUR_MS
    results = topic.batch([{"id": f"{tier}{n}", "labels": {"tier": tier}, "deliver_at": later}
                           for tier in ("gold", "free") for n in range(5)])
    assert {r["status"] for r in results} == {201}
    with running_operations(services):
        op = started(topic, kind="cancel", filter=filter_)
        done = wait_operation(topic, op["id"], 30)
    assert done["state"] == "succeeded" and (done["processed"], done["changed"]) == (0, 0)
    assert {r.state for r in rows(services, topic).values()} == {"scheduled"}


def test_a_shift_by_recipient_moves_its_scheduled_messages_through_their_windows(
        app: Flask, auth: dict[str, str], small_pages: None) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    base = (now_ms() // HOUR_MS + 48) * HOUR_MS  # on the hour, two days ahead
    messages = [{"id": f"m{n}", "recipient": ("ann", "bob")[n % 2], "campaign": "spring",
                 "deliver_at": base + n * 60_000} for n in range(30)]
    # bob's window is 00:00-01:00 UTC every day: an hour's shift puts it at the next opening
    messages.append({"id": "win", "recipient": "bob", "deliver_at": base,
                     "send_window": {"days": ["MON", "TUE", "WED", "THU", "FRI", "SAT",
                                              "SUN"], "start": "00:00", "end": "01:00"}})
    assert {r["status"] for r in topic.batch(messages)} == {201}
    before = rows(services, topic)
    with running_operations(services):
        op = started(topic, kind="shift", shift_ms=HOUR_MS, filter={"recipient": "bob"})
        done = wait_operation(topic, op["id"], 30)
    assert done["state"] == "succeeded" and done["shift_ms"] == HOUR_MS, done
    assert (done["processed"], done["changed"]) == (16, 16)
    after = rows(services, topic)
    for n in range(30):
        moved = after[f"m{n}"].deliver_at_ms - before[f"m{n}"].deliver_at_ms
        assert moved == (HOUR_MS if n % 2 else 0), (n, moved)
    # it asks for base + 1 h now, and is placed at its window's next opening from then
    shown = topic.get("win").get_json()
    asked = parse_instant(shown.get("requested_deliver_at", shown["deliver_at"]))
    placed = parse_instant(shown["deliver_at"])
    assert asked == base + HOUR_MS and after["win"].deliver_at_ms == placed
    assert asked <= placed < asked + 86_400_000 and placed // 60_000 % 1440 < 60
    # the campaign's bounds cover where its messages are now
    view = campaign(topic, "spring")
    assert parse_instant(view["last_deliver_at"]) >= max(
        after[f"m{n}"].deliver_at_ms for n in range(30))


@pytest.mark.parametrize(("kind", "state"), [("cancel", "cancelled"), ("pause", "paused")])
def test_a_cancel_or_pause_racing_a_pull_consumer_hands_out_none_it_counted_changed(
        app: Flask, auth: dict[str, str], kind: str, state: str) -> None:
    """Two consumers lease and ack the due messages of a label while a cancel (or a pause)
    of that label runs: no message the operation changed is in any lease answer, each of
    them is cancelled (paused), every other one was delivered, and the counts are those of
    the rows."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=120)
    count = 4000
    for start_n in range(0, count, 1000):
        assert {r["status"] for r in topic.batch(
            [{"id": f"r{n}", "labels": {"wave": "one"}}
             for n in range(start_n, start_n + 1000)])} == {201}
    leased: list[str] = []
    acked: set[str] = set()
    stop = threading.Event()
    lock = threading.Lock()

    def consume() -> None:
        mine = TopicClient(app.test_client(), auth, name=topic.name)
        while not stop.is_set():
            got = mine.lease(50, wait_ms=200)
            with lock:
                leased.extend(m["id"] for m in got)
            ok = mine.ack_all(got)
            with lock:
                acked.update(ok)

    consumers = [threading.Thread(target=consume) for _ in range(2)]
    for c in consumers:
        c.start()
    try:
        while len(acked) < 300:  # delivery is under way
            time.sleep(0.02)
        with running_operations(services):
            op = started(topic, kind=kind, filter={"label": ["wave:one"]})
            done = wait_operation(topic, op["id"], 60)
        time.sleep(1)  # the consumers' last calls answer
    finally:
        stop.set()
        for c in consumers:
            c.join()
    assert done["state"] == "succeeded", done
    found = rows(services, topic)
    uid = topic_uid(services, auth, topic.name)
    op_id = done["id"]
    changed_by_op = {i for i, r in found.items()
                       if r.state == state and str(r.last_op) == op_id}
    assert len(found) == count and 0 < done["changed"] == len(changed_by_op) < count
    assert not changed_by_op & set(leased), "handed out after the operation counted it"
    assert len(leased) == len(set(leased))  # none handed out twice
    delivered = {i for i, r in found.items() if r.state == "delivered"}
    assert delivered == acked and len(delivered) + len(changed_by_op) == count
    assert done["processed"] == count and done["delivering"] <= len(delivered)
    assert services.messages.get_many(uid, sorted(changed_by_op)[:5])  # rows stay


def test_pause_and_resume_of_a_campaign_alone_set_its_flag(
        app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    assert topic.enqueue(campaign="spring", delay_ms=HOUR_MS).status_code == 201
    paused = started(topic, kind="pause", filter={"campaign": "spring"})
    assert paused["kind"] == "pause" and paused["state"] == "succeeded"
    assert paused["campaign"] == "spring" and campaign(topic, "spring")["paused"] is True
    follow = topic.client.get(topic.url(f"/operations/{paused['id']}"), headers=auth)
    assert follow.status_code == 200 and follow.get_json()["kind"] == "pause"
    resumed = started(topic, kind="resume", filter={"campaign": "spring"})
    assert resumed["kind"] == "resume" and resumed["state"] == "running"
    assert campaign(topic, "spring")["paused"] is False
    assert start(topic, kind="pause", filter={"campaign": "nope"}).status_code == 404


def test_a_pause_by_label_holds_its_waiting_messages_until_a_resume(
        app: Flask, auth: dict[str, str], small_pages: None) -> None:
    """A pause by label makes every matching waiting message paused (one held by a consumer
    is counted delivering and left to it): no lease hands a paused one out, it can be
    searched, moved and cancelled, and /stats counts it. A resume by the same label brings
    back what came due at once and leaves the rest at their due times."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=300)
    later = now_ms() + HOUR_MS
    results = topic.batch(
        [{"id": f"g{n}", "labels": {"tier": "gold"}} for n in range(20)]
        + [{"id": f"soon{n}", "labels": {"tier": "gold"}, "deliver_at": later}
           for n in range(5)]
        + [{"id": f"f{n}", "labels": {"tier": "free"}} for n in range(10)])
    assert {r["status"] for r in results} == {201}
    held = topic.lease(1, wait_ms=2000)
    assert len(held) == 1
    with running_operations(services):
        op = started(topic, kind="pause", filter={"label": ["tier:gold"]})
        assert op["kind"] == "pause" and op["campaign"] is None
        done = wait_operation(topic, op["id"], 30)
    assert done["state"] == "succeeded", done
    gold_held = held[0]["id"].startswith("g")
    assert (done["processed"], done["changed"], done["delivering"]) == (
        25, 25 - gold_held, int(gold_held))
    found = rows(services, topic)
    paused = {i for i, r in found.items() if r.state == "paused"}
    assert paused == ({f"g{n}" for n in range(20)} | {f"soon{n}" for n in range(5)}) - {
        held[0]["id"]}
    assert found["soon0"].due_at_ms == later  # kept at its time
    # its row lives as long as its payload (the horizon more), not the retention past due
    uid = topic_uid(services, auth, topic.name)
    assert ttl_of(services, uid, "soon0") > services.config.horizon_days * 86_400
    # only the free ones are handed out, however long a consumer asks
    handed = {m["id"] for m in held}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        got = topic.lease(10, wait_ms=300)
        topic.ack_all(got)
        handed |= {m["id"] for m in got}
    assert handed - {held[0]["id"]} == {f"f{n}" for n in range(10)} - {held[0]["id"]}
    searched = topic.client.get(topic.url("/messages?state=paused&limit=100"),
                                headers=auth).get_json()
    assert {m["id"] for m in searched["messages"]} == paused
    stats = topic.client.get(topic.url("/stats"), headers=auth).get_json()["counts"]
    assert stats["paused"] == len(paused), stats
    # a paused message can be moved (it stays paused) and cancelled by id
    moved = topic.client.patch(topic.url("/messages/soon1"), headers=auth,
                               json={"deliver_at": later + 60_000})
    assert moved.status_code == 200 and moved.get_json()["state"] == "paused"
    assert topic.client.delete(topic.url("/messages/g1"), headers=auth).status_code == 204
    replaced = topic.enqueue(id="soon2", if_exists="replace", payload={"new": 1},
                             deliver_at=later + 120_000, labels={"tier": "gold"},
                             campaign="moved-in")
    assert replaced.status_code == 200 and replaced.get_json()["state"] == "paused"
    assert campaign(topic, "moved-in")["counts"]["paused"] == 1  # made as for a new one
    # moved far while paused, it keeps its payload as long as its row (written again)
    assert topic.client.patch(topic.url("/messages/soon3"), headers=auth,
                              json={"deliver_at": "3000-01-01T00:00:00Z"}).status_code == 200
    horizon_s = services.config.horizon_days * 86_400
    # parked at the horizon, the horizon more
    assert ttl_of(services, uid, "soon3", "message_bodies", "payload") >= 2 * horizon_s
    # paused messages keep the shard they were placed on: no shard change under them (the
    # one held is acked first: what is left waiting is paused)
    assert topic.ack(held[0]) == 204
    assert topic.client.put(topic.url(), headers=auth, json={"shards": 8}).status_code == 409
    with running_operations(services):
        op = started(topic, kind="resume", filter={"label": ["tier:gold"]})
        done = wait_operation(topic, op["id"], 30)
    assert done["state"] == "succeeded" and done["changed"] == len(paused) - 1, done
    came_due = ({f"g{n}" for n in range(20)} & paused) - {"g1"}
    assert topic.drain(len(came_due), 10) == came_due
    after = rows(services, topic)
    assert after["soon0"].state == "scheduled" and after["soon0"].due_at_ms == later
    assert after["soon1"].due_at_ms == later + 60_000 and after["g1"].state == "cancelled"
    assert (after["soon2"].state, after["soon2"].due_at_ms) == ("scheduled", later + 120_000)
    assert after["soon3"].state == "scheduled"  # parked at the horizon, to hop on


def test_a_resumed_message_still_due_ahead_is_handed_out_at_its_time(
        app: Flask, auth: dict[str, str]) -> None:
    """Paused and resumed before its due time, a message keeps that time: the resume writes
    a pointer at the row's new version though the time did not change, or no pointer would
    name it and it would never be handed out."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    due = now_ms() + 2_500
    assert topic.enqueue(id="later", deliver_at=due, labels={"k": "v"}).status_code == 201
    with running_operations(services):
        for kind in ("pause", "resume"):
            done = wait_operation(topic, started(topic, kind=kind,
                                                 filter={"label": ["k:v"]})["id"], 10)
            assert done["changed"] == 1, done
    assert now_ms() < due, "the resume came after the due time: the test proves nothing"
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = topic.lease(1, wait_ms=1000)
    assert [m["id"] for m in got] == ["later"]
    assert now_ms() >= due


@pytest.mark.parametrize(("body", "field"), [
    ({"filter": {}}, "kind"),
    ({"kind": "erase", "filter": {}}, "kind"),
    ({"kind": "cancel"}, "filter"),
    ({"kind": "cancel", "filter": []}, "filter"),
    ({"kind": "cancel", "filter": {"label": ["no-colon"]}}, "filter"),
    ({"kind": "cancel", "filter": {"label": "tier:gold"}}, "filter"),
    ({"kind": "cancel", "filter": {"state": "lost"}}, "filter"),
    ({"kind": "cancel", "filter": {"recipient": "a b"}}, "filter"),
    ({"kind": "cancel", "filter": {"due_from": "yesterday"}}, "filter"),
    ({"kind": "cancel", "filter": {"colour": "red"}}, "filter"),
    ({"kind": "shift", "filter": {}}, "shift_ms"),
    ({"kind": "shift", "filter": {}, "shift_ms": 0}, "shift_ms"),
    ({"kind": "shift", "filter": {}, "shift_ms": "soon"}, "shift_ms"),
    ({"kind": "cancel", "filter": {}, "shift_ms": 1000}, "shift_ms"),
])
def test_bad_input_is_a_400_naming_the_field(app: Flask, auth: dict[str, str],
                                             body: dict[str, Any], field: str) -> None:
    topic = TopicClient(app.test_client(), auth)
    answer = start(topic, **body)
    assert answer.status_code == 400, answer.get_json()
    assert answer.content_type == "application/problem+json"
    assert field in answer.get_json()["errors"], answer.get_json()


def test_an_unknown_operation_or_topic_is_404(app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    for op_id in ("nope", "2f1c7a4e-0b7e-11f0-9cd2-0242ac120002"):
        answer = topic.client.get(topic.url(f"/operations/{op_id}"), headers=auth)
        assert answer.status_code == 404
    missing = topic.client.post("/v1/topics/absent-topic/operations", headers=auth,
                                json={"kind": "cancel", "filter": {}})
    assert missing.status_code == 404
