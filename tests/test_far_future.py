"""Messages asking for a time beyond the horizon, on the real node (docs/design.md, Times):
accepted up to year 9999, parked at the horizon with bounded TTLs, moved on by the take
when they come due there (payload first), and handed out at their own time, never before.
The take is driven with its clock given, so years pass in a few calls."""

from __future__ import annotations

from typing import Any

from flask import Flask

from app.core.timeline import MS_PER_DAY, pointer_of
from app.core.timeparse import parse_instant
from app.delivery.leasing import Hold, take, take_with_payloads
from app.delivery.scan import Due
from app.models import MessageState
from app.services import Services
from tests.campaign_helpers import running_operations, topic_of, ttl_of, wait_operation
from tests.consumers import TopicClient, now_ms

HOLD = Hold(30, "far-consumer")


def _row(services: Services, uid: Any, message_id: str) -> MessageState:
    row = services.messages.get(uid, message_id)
    assert row is not None
    return row


def _payload_ttl(services: Services, uid: Any, message_id: str) -> int:
    return ttl_of(services, uid, message_id, "message_bodies", "payload")


def test_a_time_years_ahead_is_kept_and_parked_at_the_horizon(
        app: Flask, auth: dict[str, str]) -> None:
    """Enqueue, batch and PATCH take any time up to year 9999: the row keeps it as its
    deliver_at, is due at now + horizon, and lives no longer than that plus retention (its
    payload the horizon more); it can be cancelled like any other."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    horizon_ms = services.config.horizon_days * MS_PER_DAY
    far = "6753-03-01T00:00:00Z"
    before = now_ms()
    answer = topic.enqueue(id="far", deliver_at=far, payload={"n": 1})
    assert answer.status_code == 201, answer.get_json()
    assert parse_instant(answer.get_json()["deliver_at"]) == parse_instant(far)
    assert [r["status"] for r in topic.batch([
        {"id": "far-batch", "deliver_at": "9999-12-31T23:59:59Z", "campaign": "long"}])] == [201]
    uid = topic_of(services, auth, topic.name).uid
    retention_s = services.config.retention_days * 86_400
    for message_id in ("far", "far-batch"):
        row = _row(services, uid, message_id)
        assert row.state == "scheduled" and before + horizon_ms <= row.due_at_ms <= (
            now_ms() + horizon_ms)
        # parked: the row lives as long as its payload (a hop may come late), not only
        # the retention past its parking point; both far inside Cassandra's 20 years
        payload_ttl = _payload_ttl(services, uid, message_id)
        assert payload_ttl <= 2 * horizon_ms // 1000 + retention_s
        assert payload_ttl - 10 <= ttl_of(services, uid, message_id) <= payload_ttl
    assert topic.get("far").get_json()["deliver_at"].startswith("6753-03-01T00:00:00")
    moved = topic.client.patch(topic.url("/messages/far"), headers=auth,
                               json={"deliver_at": "3000-01-01T00:00:00Z"})
    assert moved.status_code == 200, moved.get_json()
    row = _row(services, uid, "far")
    assert row.deliver_at_ms == parse_instant("3000-01-01T00:00:00Z")
    assert row.due_at_ms <= now_ms() + horizon_ms
    assert topic.client.delete(topic.url("/messages/far"), headers=auth).status_code == 204


def test_a_hop_that_parks_again_writes_payload_and_campaign_entry_to_live_as_long(
        app: Flask, auth: dict[str, str]) -> None:
    """A message two and a half horizons ahead hops from its parking point to the next one:
    its payload (and campaign-index entry, in the same write) is written again, from the
    hop, to live as long as its row (due + horizon + retention), so the second hop still
    finds it (at enqueue it was written to last only through the first hop's span)."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    horizon_ms = services.config.horizon_days * MS_PER_DAY
    deliver = now_ms() + 2 * horizon_ms + horizon_ms // 2
    assert topic.enqueue(id="twice", deliver_at=deliver, campaign="far").status_code == 201
    found = topic_of(services, auth, topic.name)
    parked = _row(services, found.uid, "twice")
    # as it would be at its parking point, a year on: its payload near its end
    key = ("twice", parked.content_hash)
    body = services.messages.get_payloads(found.uid, [key])[key]
    services.messages.stage(found.uid, [(found.uid, *key, body, 1000)], [])
    assert _payload_ttl(services, found.uid, "twice") <= 1000
    at = parked.due_at_ms + 1
    assert take(services, found, [Due(pointer_of(parked), parked)], at, [HOLD]) == []
    hopped = _row(services, found.uid, "twice")
    assert (hopped.version, hopped.deliver_at_ms, hopped.due_at_ms) == (2, deliver,
                                                                         at + horizon_ms)
    # TTLs as the hop computed them at its given clock (Cassandra counts from the write)
    retention_s = services.config.retention_days * 86_400
    wanted_s = 2 * horizon_ms // 1000 + retention_s
    assert wanted_s - 10 <= _payload_ttl(services, found.uid, "twice") <= wanted_s
    assert wanted_s - 10 <= ttl_of(services, found.uid, "twice") <= wanted_s


def test_a_campaign_shift_of_a_message_moved_years_ahead_parks_it(
        app: Flask, auth: dict[str, str]) -> None:
    """A message of a campaign moved (PATCH) to year 3000, then the campaign shifted by a
    minute: the shift's step parks it at the horizon (before, its TTLs passed Cassandra's
    20-year cap: the operation failed on every run and the campaign stayed "being
    shifted")."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    assert topic.enqueue(id="m", campaign="c", delay_ms=3_600_000).status_code == 201
    assert topic.client.patch(topic.url("/messages/m"), headers=auth, json={
        "deliver_at": "3000-01-01T00:00:00Z"}).status_code == 200
    with running_operations(services):
        answer = topic.client.patch(topic.url("/campaigns/c"), headers=auth,
                                    json={"shift_ms": 60_000})
        assert answer.status_code == 202, answer.get_json()
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 30)
    assert done["state"] == "succeeded" and done["changed"] == 1, done
    row = _row(services, topic_of(services, auth, topic.name).uid, "m")
    assert row.deliver_at_ms == parse_instant("3000-01-01T00:01:00Z")
    assert row.due_at_ms <= now_ms() + services.config.horizon_days * MS_PER_DAY


def test_shifts_beyond_the_horizon_park_and_only_year_9999_bounds_them(
        app: Flask, auth: dict[str, str]) -> None:
    """A campaign shift and a filtered shift that move messages past the horizon are
    accepted, as an enqueue at those times would be: the messages keep their new
    deliver_at and wait parked. A campaign shift whose last message would pass year 9999 is
    a 400 naming shift_ms; a filtered one leaves such a message where it is."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    horizon_ms = services.config.horizon_days * MS_PER_DAY
    shift_ms = 10 * MS_PER_DAY
    near = now_ms() + horizon_ms - 5 * MS_PER_DAY  # 5 days before the horizon
    end = parse_instant("9999-12-01T00:00:00Z")
    assert topic.enqueue(id="c1", campaign="far", deliver_at=near).status_code == 201
    assert topic.enqueue(id="c2", campaign="far", deliver_at=near).status_code == 201
    last_days = parse_instant("9999-12-25T00:00:00Z")  # 10 days on is year 10000
    # moved where the campaign's bounds do not follow: its step leaves it, the rest moves
    assert topic.client.patch(topic.url("/messages/c2"), headers=auth, json={
        "deliver_at": last_days}).status_code == 200
    for message_id, deliver in (("f1", near), ("f2", last_days)):
        assert topic.enqueue(id=message_id, deliver_at=deliver,
                             labels={"wave": "b"}).status_code == 201
    uid = topic_of(services, auth, topic.name).uid
    with running_operations(services):
        answer = topic.client.patch(topic.url("/campaigns/far"), headers=auth,
                                    json={"shift_ms": shift_ms})
        assert answer.status_code == 202, answer.get_json()
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 30)
        assert (done["state"], done["changed"]) == ("succeeded", 1), done
        answer = topic.client.post(topic.url("/operations"), headers=auth, json={
            "kind": "shift", "shift_ms": shift_ms, "filter": {"label": ["wave:b"]}})
        assert answer.status_code == 202, answer.get_json()
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 30)
    assert (done["state"], done["processed"], done["changed"]) == ("succeeded", 2, 1), done
    for message_id in ("c1", "f1"):
        row = _row(services, uid, message_id)
        assert (row.state, row.deliver_at_ms) == ("scheduled", near + shift_ms)
        assert row.due_at_ms <= now_ms() + horizon_ms  # parked
    for message_id in ("c2", "f2"):  # past year 9999: left alone
        assert _row(services, uid, message_id).deliver_at_ms == last_days
    assert topic.enqueue(id="e", campaign="end", deliver_at=end).status_code == 201
    refused = topic.client.patch(topic.url("/campaigns/end"), headers=auth,
                                 json={"shift_ms": 100 * MS_PER_DAY})
    assert refused.status_code == 400 and "shift_ms" in refused.get_json()["errors"]


def test_a_parked_message_hops_on_and_is_handed_out_at_its_time_never_before(
        app: Flask, auth: dict[str, str]) -> None:
    """A message due 20 days past the horizon: when the take reaches its parking point it
    moves it on to its deliver_at (payload rewritten to outlive it, attempts not counted,
    nothing handed out); a take a moment before deliver_at finds nothing due, one at it
    leases the message with its payload."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    horizon_ms = services.config.horizon_days * MS_PER_DAY
    deliver = now_ms() + horizon_ms + 20 * MS_PER_DAY
    assert topic.enqueue(id="hop", deliver_at=deliver, payload={"hello": "later"}
                         ).status_code == 201
    found = topic_of(services, auth, topic.name)
    parked = _row(services, found.uid, "hop")
    assert parked.due_at_ms < deliver
    at = parked.due_at_ms + 1  # the parking point reached
    assert take(services, found, [Due(pointer_of(parked), parked)], at, [HOLD]) == []
    hopped = _row(services, found.uid, "hop")
    assert (hopped.state, hopped.version, hopped.attempts, hopped.deliver_at_ms,
            hopped.due_at_ms) == ("scheduled", 2, 0, deliver, deliver)
    # landed within the horizon: the payload written at enqueue (its parking point, the
    # horizon and the retention ahead) outlives the new due time and its retention
    outlives_s = (deliver - now_ms()) // 1000 + services.config.retention_days * 86_400
    assert _payload_ttl(services, found.uid, "hop") >= outlives_s
    due = Due(pointer_of(hopped), hopped)
    assert take(services, found, [due], deliver - 1, [HOLD]) == []
    assert _row(services, found.uid, "hop").version == 2  # not even looked at: not due
    [(leased, payload)] = take_with_payloads(services, found, [due], deliver, [HOLD])
    assert (leased.state, leased.attempts, leased.consumer) == ("leased", 1, "far-consumer")
    assert payload is not None and payload.data == b'{"hello":"later"}'
