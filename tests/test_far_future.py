"""Messages asking for a time beyond the horizon, on the real node (docs/design.md, Times):
accepted up to year 9999, parked at the horizon with bounded TTLs, moved on by the take
when they come due there (payload first), and handed out at their own time, never before.
The take is driven with its clock given, so years pass in a few calls."""

from __future__ import annotations

from typing import Any

from flask import Flask

from app.core.ids import home_of
from app.core.timeline import MS_PER_DAY, pointer_of
from app.core.timeparse import parse_instant
from app.delivery.leasing import Hold, take, take_with_payloads
from app.delivery.scan import Due
from app.models import MessageState
from app.services import Services
from tests.campaign_helpers import topic_of
from tests.consumers import TopicClient, now_ms

HOLD = Hold(30, "far-consumer")


def _row(services: Services, uid: Any, message_id: str) -> MessageState:
    row = services.messages.get(uid, message_id)
    assert row is not None
    return row


def _payload_ttl(services: Services, uid: Any, message_id: str) -> int:
    [found] = services.db.execute(
        "SELECT TTL(payload) AS ttl FROM {ks}.message_bodies WHERE topic_uid = ? AND home = ? "
        "AND id = ?", (uid, home_of(message_id), message_id))
    ttl: int = found["ttl"]
    return ttl


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
        {"id": "far-batch", "deliver_at": "9999-12-31T23:59:59Z"}])] == [201]
    uid = topic_of(services, auth, topic.name).uid
    for message_id in ("far", "far-batch"):
        row = _row(services, uid, message_id)
        assert row.state == "scheduled" and before + horizon_ms <= row.due_at_ms <= (
            now_ms() + horizon_ms)
        retention_s = services.config.retention_days * 86_400
        assert _payload_ttl(services, uid, message_id) <= 2 * horizon_ms // 1000 + retention_s
    assert topic.get("far").get_json()["deliver_at"].startswith("6753-03-01T00:00:00")
    moved = topic.client.patch(topic.url("/messages/far"), headers=auth,
                               json={"deliver_at": "3000-01-01T00:00:00Z"})
    assert moved.status_code == 200, moved.get_json()
    row = _row(services, uid, "far")
    assert row.deliver_at_ms == parse_instant("3000-01-01T00:00:00Z")
    assert row.due_at_ms <= now_ms() + horizon_ms
    assert topic.client.delete(topic.url("/messages/far"), headers=auth).status_code == 204


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
    # the payload was written again, to live from the hop past the next span: its new due
    # time, the horizon (moves) and the retention (Cassandra counts the TTL from the real
    # write time; the hop computed it at its given clock, as it would at that moment)
    wanted_s = ((deliver - at + horizon_ms) // 1000
                + services.config.retention_days * 86_400)
    assert wanted_s - 10 <= _payload_ttl(services, found.uid, "hop") <= wanted_s
    due = Due(pointer_of(hopped), hopped)
    assert take(services, found, [due], deliver - 1, [HOLD]) == []
    assert _row(services, found.uid, "hop").version == 2  # not even looked at: not due
    [(leased, payload)] = take_with_payloads(services, found, [due], deliver, [HOLD])
    assert (leased.state, leased.attempts, leased.consumer) == ("leased", 1, "far-consumer")
    assert payload is not None and payload.data == b'{"hello":"later"}'
