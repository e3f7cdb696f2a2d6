"""Campaigns on the real node: the view and its counters through every transition, bad input,
shift and pause / resume under delivery, an enqueue racing a cancel. Every lease is checked
for early delivery (tests.consumers); the counters are checked against the rows."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.campaigns.rules import CampaignRules
from app.config import Config
from app.core.timeparse import format_ms, parse_instant
from app.messages.enqueue import EnqueueResult, enqueue, new_message
from app.models import Topic
from app.services import Services
from tests.campaign_helpers import (
    campaign,
    running_operations,
    states_of,
    topic_uid,
    wait_operation,
)
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms


def _problem(answer: Any, status: int, field: str | None = None) -> None:
    assert answer.status_code == status, answer.get_json()
    assert answer.mimetype == "application/problem+json"
    if field is not None:
        assert field in answer.get_json()["errors"], answer.get_json()


def test_view_counts_follow_every_transition_and_match_the_rows(
        app: Flask, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=1, max_attempts=2)
    start = now_ms()
    results = topic.batch([{"campaign": "spring", "deliver_at": start - 1000 + i}
                           for i in range(6)])
    topic.batch([{"campaign": "later", "deliver_at": start + 3_600_000 + i * 60_000}
                 for i in range(3)])
    ids = [r["id"] for r in results]
    view = campaign(topic, "spring")
    assert view["counts"] == {"scheduled": 6, "paused": 0, "leased": 0, "delivered": 0,
                              "cancelled": 0, "dead": 0}
    assert parse_instant(view["first_deliver_at"]) == start - 1000
    assert parse_instant(view["last_deliver_at"]) == start - 995
    assert view["paused"] is False and view["max_per_second"] is None
    later = campaign(topic, "later")
    assert parse_instant(later["last_deliver_at"]) == start + 3_600_000 + 120_000

    leased = {m["id"]: m for m in topic.lease(6, wait_ms=3000)}
    assert set(leased) == set(ids)
    assert topic.ack(leased[ids[0]]) == 204  # an ack without a read: campaign from the token
    acks = topic.client.post(topic.url("/acks"), headers=auth, json={"acks": [
        {"id": ids[1], "lease_token": leased[ids[1]]["lease"]["token"]}]})
    assert acks.get_json()["results"][0]["status"] == 204
    nack = topic.client.post(topic.url(f"/messages/{ids[2]}/nack"), headers=auth,
                             json={"lease_token": leased[ids[2]]["lease"]["token"]})
    assert nack.status_code == 204
    assert topic.client.delete(topic.url(f"/messages/{ids[3]}"),
                               headers=auth).status_code == 204
    # ids[4], ids[5] leases run out; ids[2] is due again after its backoff (1 s): their
    # second attempts are the last allowed, and a nack then makes them dead
    second: set[str] = set()
    deadline = time.monotonic() + 10
    while len(second) < 3 and time.monotonic() < deadline:
        for m in topic.lease(6, wait_ms=500):
            nack = topic.client.post(topic.url(f"/messages/{m['id']}/nack"), headers=auth,
                                     json={"lease_token": m["lease"]["token"]})
            assert nack.status_code == 204
            second.add(m["id"])
    assert second == {ids[2], ids[4], ids[5]}
    counts = campaign(topic, "spring")["counts"]
    truth = states_of(services, topic_uid(services, auth, topic.name), "spring")
    assert truth == {"scheduled": 0, "paused": 0, "leased": 0, "delivered": 2, "cancelled": 1,
                     "dead": 3}
    assert counts == truth
    listed = topic.client.get(topic.url("/campaigns"), headers=auth).get_json()["campaigns"]
    assert {c["campaign"] for c in listed} == {"spring", "later"}


def test_an_ack_token_with_a_forged_campaign_is_decided_on_a_read(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """The no-read ack conditions on the token's campaign: a token naming another campaign
    must not apply blind (that would count it there), yet the lease it names is acked."""
    topic = TopicClient(client, auth)
    topic.enqueue(id="f1", campaign="real")
    topic.enqueue(id="f2", campaign="other")
    [m] = [m for m in topic.lease(2, wait_ms=3000) if m["id"] == "f1"]
    forged = m["lease"]["token"].rsplit(".", 1)[0] + ".other"
    answer = client.post(topic.url("/messages/f1/ack"), headers=auth,
                         json={"lease_token": forged})
    assert answer.status_code == 204
    assert campaign(topic, "real")["counts"]["delivered"] == 1
    assert campaign(topic, "other")["counts"]["delivered"] == 0


def test_bad_campaign_requests_are_problems_naming_the_field(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    _problem(client.get(topic.url("/campaigns/nobody"), headers=auth), 404)
    _problem(client.delete(topic.url("/campaigns/nobody"), headers=auth), 404)
    _problem(client.patch(topic.url("/campaigns/nobody"), headers=auth,
                          json={"paused": True}), 404)
    _problem(client.get(topic.url("/campaigns/Bad!"), headers=auth), 400, "campaign")
    topic.enqueue(campaign="c", deliver_at=parse_instant("9999-12-01T00:00:00Z"))
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth,  # past year 9999
                          json={"shift_ms": 86_400_000 * 100}), 400, "shift_ms")
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth,
                          json={"max_per_second": 0}), 400, "max_per_second")
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth,
                          json={"max_per_second": -5}), 400, "max_per_second")
    # a pace slower than one a 1,000 s stalled every take of the topic; a number is a number
    for pace in (1e-300, 0.0009, " 5 ", "1_000", True):
        _problem(client.patch(topic.url("/campaigns/c"), headers=auth,
                              json={"max_per_second": pace}), 400, "max_per_second")
    slowest = client.patch(topic.url("/campaigns/c"), headers=auth, json={"max_per_second": 0.001})
    assert slowest.status_code == 200 and slowest.get_json()["max_per_second"] == 0.001
    _problem(client.put(topic.url(""), headers=auth, json={"retry": {"backoff_seconds": "2"}}),
             400, "retry")
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth, json={"shift_ms": 0}),
             400, "shift_ms")
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth,
                          json={"shift_ms": 1000, "paused": True}), 400, "shift_ms")
    _problem(client.patch(topic.url("/campaigns/c"), headers=auth, json={}), 400, "shift_ms")
    _problem(client.get(topic.url("/operations/not-a-uuid"), headers=auth), 404)
    _, stranger = new_tenant_key(client.application.extensions["duetime"])
    _problem(client.get(topic.url("/campaigns/c"), headers=stranger), 404)
    assert client.get(topic.url("/campaigns/c"), headers=auth).status_code == 200


def test_shift_moves_every_scheduled_message_and_its_bounds_under_delivery(
        app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth, lease_seconds=30)
    start = now_ms()
    original = {r["id"]: start + 3000 + i * 10 for i, r in enumerate(topic.batch(
        [{"campaign": "move", "deliver_at": start + 3000 + i * 10} for i in range(200)]))}
    stay = [r["id"] for r in topic.batch(
        [{"campaign": "stay", "deliver_at": start + 2000} for _ in range(20)])]
    got: dict[str, dict[str, Any]] = {}
    stop = threading.Event()

    def consume() -> None:
        mine = TopicClient(app.test_client(), auth, name=topic.name)
        while not stop.is_set():
            for m in mine.lease(50, wait_ms=200):
                got[m["id"]] = m
                assert mine.ack(m) == 204

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        with running_operations(app.extensions["duetime"]):
            answer = topic.client.patch(topic.url("/campaigns/move"), headers=auth,
                                        json={"shift_ms": 4000})
            assert answer.status_code == 202, answer.get_json()
            op = answer.get_json()["operation"]
            assert answer.headers["Location"].endswith(f"/operations/{op['id']}")
            assert op["kind"] == "shift" and op["state"] == "running"
            done = wait_operation(topic, op["id"], 20)
        assert done["state"] == "succeeded"
        assert done["processed"] == 200 and done["changed"] == 200
        deadline = time.monotonic() + 20
        while len(got) < 220 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        consumer.join()
    missing = {i: topic.get(i).get_json() for i in [*original, *stay] if i not in got}
    assert not missing, missing  # each with its row: state, version, deliver_at, attempts
    for message_id, due in original.items():
        m = got[message_id]
        assert parse_instant(m["deliver_at"]) == due + 4000
        assert m["received_at"] >= due + 4000  # never before its new time
    view = campaign(topic, "move")
    assert parse_instant(view["first_deliver_at"]) == start + 7000
    assert parse_instant(view["last_deliver_at"]) == start + 7000 + 199 * 10
    assert view["counts"]["delivered"] == 200 and view["operation"] is None


def test_a_shift_never_moves_a_message_before_now(app: Flask, auth: dict[str, str]) -> None:
    topic = TopicClient(app.test_client(), auth)
    start = now_ms()
    [r] = topic.batch([{"campaign": "back", "deliver_at": start + 60_000}])
    with running_operations(app.extensions["duetime"]):
        answer = topic.client.patch(topic.url("/campaigns/back"), headers=auth,
                                    json={"shift_ms": -3_600_000})
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 20)
    assert done["changed"] == 1
    moved = parse_instant(topic.get(r["id"]).get_json()["deliver_at"])
    assert start <= moved <= now_ms()
    assert [m["id"] for m in topic.lease(1, wait_ms=3000)] == [r["id"]]


def test_pause_holds_a_campaign_back_and_resume_delivers_it(
        app: Flask, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    start = now_ms()
    held = {r["id"] for r in topic.batch(
        [{"campaign": "held", "deliver_at": start + 1000 + i} for i in range(150)])}
    paused = topic.client.patch(topic.url("/campaigns/held"), headers=auth,
                                json={"paused": True})
    assert paused.status_code == 200 and paused.get_json()["paused"] is True
    free = {r["id"] for r in topic.batch([{"campaign": "free"} for _ in range(40)])}
    delivered = topic.drain(40, within_s=4)
    assert delivered == free
    time.sleep(1.5)  # the held messages are due now; passes go on passing them over
    assert topic.drain(1, within_s=1.5) == set()
    view = campaign(topic, "held")
    assert view["counts"]["scheduled"] == 150 and view["paused"] is True
    with running_operations(services):
        resumed = topic.client.patch(topic.url("/campaigns/held"), headers=auth,
                                     json={"paused": False})
        assert resumed.status_code == 200 and resumed.get_json()["paused"] is False
        assert resumed.get_json()["operation"] is not None  # the resume operation
        delivered = topic.drain(150, within_s=20)
    assert delivered == held
    assert campaign(topic, "held")["counts"]["delivered"] == 150
    truth = states_of(services, topic_uid(services, auth, topic.name), "held")
    assert truth["delivered"] == 150


def test_an_enqueue_racing_a_cancel_is_covered_or_refused(
        app: Flask, auth: dict[str, str]) -> None:
    """Producers keep adding to a campaign while it is cancelled: every message accepted
    ends cancelled (none delivered), every other answer is a 409, and the counts match."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    topic.batch([{"campaign": "race", "deliver_at": now_ms() + 600_000} for _ in range(500)])
    statuses: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        mine = TopicClient(app.test_client(), auth, name=topic.name)
        while not stop.is_set():
            for r in mine.batch([{"campaign": "race", "deliver_at": now_ms() + 600_000}
                                 for _ in range(20)]):
                statuses.append(r["status"])

    producers = [threading.Thread(target=produce) for _ in range(3)]
    for p in producers:
        p.start()
    try:
        time.sleep(0.5)
        with running_operations(services):
            answer = topic.client.delete(topic.url("/campaigns/race"), headers=auth)
            assert answer.status_code == 202
            op_id = answer.get_json()["operation"]["id"]
            again = topic.client.delete(topic.url("/campaigns/race"), headers=auth)
            assert again.get_json()["operation"]["id"] == op_id  # the same operation
            done = wait_operation(topic, op_id, 60)
            time.sleep(0.3)
    finally:
        stop.set()
        for p in producers:
            p.join()
    assert done["state"] == "succeeded"
    assert set(statuses) <= {201, 409} and 409 in statuses, set(statuses)
    truth = states_of(services, topic_uid(services, auth, topic.name), "race")
    accepted = 500 + statuses.count(201)
    assert truth == {"scheduled": 0, "paused": 0, "leased": 0, "delivered": 0, "dead": 0,
                     "cancelled": truth["cancelled"]}
    assert truth["cancelled"] >= accepted  # plus those cancelled by their own enqueue (409)
    assert campaign(topic, "race")["counts"] == truth
    refused = topic.enqueue(campaign="race", deliver_at=format_ms(now_ms() + 1000))
    _problem(refused, 409)
    assert campaign(topic, "race")["cancelled"] is True


def _stale_process(config: Config, topic: TopicClient, auth: dict[str, str]
                   ) -> tuple[Services, Topic]:
    """Another process whose view of the campaigns is read now and never refreshed: it does
    not know of what is about to happen, so only the check after writing can catch it."""
    other = Services(config)
    other.campaign_rules = CampaignRules(other.campaigns, refresh_ms=3_600_000)
    uid = topic_uid(other, auth, topic.name)
    found = next(t for t in other.topics.all() if t.uid == uid)
    other.campaign_rules.of(uid)
    return other, found


def _enqueue_one(services: Services, topic: Topic, campaign_name: str,
                 deliver_at_ms: int) -> EnqueueResult:
    item = new_message({"campaign": campaign_name, "deliver_at": deliver_at_ms, "payload": 1},
                       services.clock(), 65536)
    [result] = enqueue(services, topic, [item])
    return result


def test_a_process_unaware_of_a_cancel_has_its_message_cancelled_after_writing(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    topic.batch([{"campaign": "gone", "deliver_at": now_ms() + 600_000} for _ in range(10)])
    other, found = _stale_process(config, topic, auth)
    try:
        with running_operations(services):
            answer = topic.client.delete(topic.url("/campaigns/gone"), headers=auth)
            wait_operation(topic, answer.get_json()["operation"]["id"], 20)
        late = _enqueue_one(other, found, "gone", now_ms() + 600_000)
    finally:
        other.close()
    assert late.status == 409 and late.id is not None
    assert topic.get(late.id).get_json()["state"] == "cancelled"
    truth = states_of(services, found.uid, "gone")
    assert truth["cancelled"] == 11 and truth["scheduled"] == 0
    assert campaign(topic, "gone")["counts"] == truth
    # a cancelled campaign cannot be paused, resumed, paced or shifted (409, as documented)
    for change in ({"paused": True}, {"paused": False}, {"max_per_second": 5},
                   {"shift_ms": 1000}):
        _problem(topic.client.patch(topic.url("/campaigns/gone"), headers=auth, json=change),
                 409)
    assert campaign(topic, "gone")["paused"] is False


def test_a_process_unaware_of_a_shift_shifts_its_own_message_once(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    due = now_ms() + 600_000
    topic.batch([{"campaign": "slide", "deliver_at": due} for _ in range(10)])
    other, found = _stale_process(config, topic, auth)
    try:
        answer = topic.client.patch(topic.url("/campaigns/slide"), headers=auth,
                                    json={"shift_ms": 60_000})
        assert answer.status_code == 202  # marked, not run yet: no runner is running
        late = _enqueue_one(other, found, "slide", due)
    finally:
        other.close()
    assert late.status == 201 and late.deliver_at_ms == due + 60_000
    with running_operations(services):
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 20)
    assert done["processed"] == 11 and done["changed"] == 11
    assert late.id is not None
    assert parse_instant(topic.get(late.id).get_json()["deliver_at"]) == due + 60_000
    view = campaign(topic, "slide")
    assert parse_instant(view["first_deliver_at"]) == due + 60_000
    assert parse_instant(view["last_deliver_at"]) == due + 60_000
