"""Send windows on the real node, on each path that sets a due time: enqueue and GET, batch,
the Spark import's row transform, a schedule's fire, PATCH, a campaign shift, a nack's delay
and a failed webhook POST's backoff; a message's own window and `false`; quiet hours as its
spelling; bad windows answer 400 naming the field.

Windows are made around the test's clock: CLOSED opens two hours from now (so what is due
now waits for it), OPEN holds now. Each expectation is computed by the pure placement
(app.core.send_window), which tests/test_send_window.py checks against the wall clock."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any
from zoneinfo import ZoneInfo

from flask import Flask
from flask.testing import FlaskClient

from app.core.send_window import SendWindow
from app.core.timeline import MS_PER_HOUR
from app.core.timeparse import parse_instant, parse_local_time
from app.models import MessageState
from app.schedules.manage import fires_index
from app.services import Services
from spark.rows import ImportSettings, to_message
from tests.campaign_helpers import running_operations, topic_of, wait_operation
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving

UTC = ZoneInfo("UTC")
MINUTE = 60_000
EVERY_DAY = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"]


def _hhmm(epoch_ms: int) -> str:
    minute = epoch_ms // MINUTE % 1440
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _window(start_ms: int, end_ms: int) -> dict[str, Any]:
    return {"days": EVERY_DAY, "start": _hhmm(start_ms), "end": _hhmm(end_ms)}


def closed() -> dict[str, Any]:
    """Every day, from two to three hours from now (UTC): closed now."""
    now = now_ms()
    return _window(now + 2 * MS_PER_HOUR, now + 3 * MS_PER_HOUR)


def open_now(until_ms: int = MS_PER_HOUR) -> dict[str, Any]:
    """Every day, from an hour ago to until_ms from now (rounded up to a minute)."""
    now = now_ms()
    return _window(now - MS_PER_HOUR, now + until_ms + MINUTE)


def placed(window: dict[str, Any], due_ms: int) -> int:
    return SendWindow.parse(window["days"], window["start"], window["end"]).place(due_ms, UTC)


def _row(app: Flask, auth: dict[str, str], topic: TopicClient, message_id: str
         ) -> MessageState:
    services: Services = app.extensions["duetime"]
    row = services.messages.get(topic_of(services, auth, topic.name).uid, message_id)
    assert row is not None
    return row


def _problem(answer: Any, *path: str) -> None:
    assert answer.status_code == 400, answer.get_json()
    assert answer.mimetype == "application/problem+json"
    errors = answer.get_json()["errors"]
    for key in path:
        assert key in errors, answer.get_json()
        errors = errors[key]


def test_enqueue_and_batch_place_outside_times_at_the_next_opening(
        client: FlaskClient, auth: dict[str, str]) -> None:
    window = closed()
    topic = TopicClient(client, auth, send_window=window)
    shown = client.get(topic.url(), headers=auth).get_json()
    assert shown["send_window"] == window and shown["quiet_hours"] is None
    before = now_ms()
    held = topic.enqueue(id="held").get_json()
    opening = placed(window, before)
    assert opening >= before + 2 * MS_PER_HOUR - MINUTE
    assert parse_instant(held["deliver_at"]) == opening
    got = topic.get("held").get_json()
    assert parse_instant(got["deliver_at"]) == opening
    assert before <= parse_instant(got["requested_deliver_at"]) <= now_ms()
    inside = opening + 10 * MINUTE
    kept = topic.enqueue(id="kept", deliver_at=inside).get_json()
    assert parse_instant(kept["deliver_at"]) == inside
    assert "requested_deliver_at" not in topic.get("kept").get_json()
    results = topic.batch([{"id": "b1"}, {"id": "b2", "deliver_at": inside},
                           {"id": "b3", "send_window": False},
                           {"id": "b4", "send_window": {**window, "days": ["MON"],
                                                        "start": "09:00", "end": "09:00"}},
                           {"id": "b5", "send_window": {"days": []}}])
    assert parse_instant(results[0]["deliver_at"]) == opening
    assert parse_instant(results[1]["deliver_at"]) == inside
    assert parse_instant(results[2]["deliver_at"]) <= now_ms()  # exempt: due now
    monday = SendWindow.parse(["MON"], "09:00", "09:00").place(now_ms(), UTC)
    assert abs(parse_instant(results[3]["deliver_at"]) - monday) < 5_000  # its own window
    assert results[4]["status"] == 400 and "send_window" in results[4]["error"]["errors"]
    assert {m["id"] for m in topic.lease(10, wait_ms=1000)} == {"b3"} | (
        {"b4"} if monday <= now_ms() else set())


def test_a_message_window_overrides_the_topic_and_false_exempts(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, send_window=closed())
    own = topic.enqueue(id="own", send_window=open_now()).get_json()
    assert parse_instant(own["deliver_at"]) <= now_ms()
    assert "requested_deliver_at" not in topic.get("own").get_json()
    free = topic.enqueue(id="free", send_window=False).get_json()
    assert parse_instant(free["deliver_at"]) <= now_ms()
    spelled = topic.enqueue(id="spelled", quiet_hours=False).get_json()
    assert parse_instant(spelled["deliver_at"]) <= now_ms()
    # its own zone: the topic's closed hours, read 12 hours away, hold now
    away = topic.enqueue(id="away", timezone="Etc/GMT+12").get_json()
    assert parse_instant(away["deliver_at"]) > now_ms() + MS_PER_HOUR
    assert {m["id"] for m in topic.lease(10, wait_ms=2000)} == {"own", "free", "spelled"}


def test_quiet_hours_are_a_spelling_of_the_window_and_one_replaces_the_other(
        client: FlaskClient, auth: dict[str, str]) -> None:
    now = now_ms()
    quiet = {"start": _hhmm(now - MS_PER_HOUR), "end": _hhmm(now + MS_PER_HOUR),
             "timezone": "UTC"}
    topic = TopicClient(client, auth, quiet_hours=quiet)
    same = {"days": EVERY_DAY, "start": quiet["end"], "end": quiet["start"]}
    held = topic.enqueue(id="q").get_json()
    assert parse_instant(held["deliver_at"]) == placed(same, now_ms())
    assert "requested_deliver_at" in topic.get("q").get_json()
    both = client.put(topic.url(), json={"quiet_hours": quiet, "send_window": same},
                      headers=auth)
    _problem(both, "send_window")
    swapped = client.put(topic.url(), json={"send_window": open_now()}, headers=auth)
    assert swapped.status_code == 200 and swapped.get_json()["quiet_hours"] is None
    assert parse_instant(topic.enqueue().get_json()["deliver_at"]) <= now_ms()
    removed = client.put(topic.url(), json={"send_window": None}, headers=auth).get_json()
    assert removed["send_window"] is None and removed["quiet_hours"] is None


def test_bad_windows_are_400s_naming_the_field(client: FlaskClient,
                                              auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    for bad, field in (({"days": [], "start": "09:00", "end": "20:00"}, "days"),
                       ({"days": ["MON", "MON"], "start": "09:00", "end": "20:00"}, "days"),
                       ({"days": ["Funday"], "start": "09:00", "end": "20:00"}, "days"),
                       ({"days": ["MON"], "start": "9:00", "end": "20:00"}, "start"),
                       ({"days": ["MON"], "start": "09:00", "end": "24:00"}, "end"),
                       ({"days": ["MON"], "start": "09:00"}, "end"),
                       ({"days": ["MON"], "start": "09:00", "end": "20:00", "tz": "x"}, "tz")):
        _problem(client.put(topic.url(), json={"send_window": bad}, headers=auth),
                 "send_window", field)
        _problem(topic.enqueue(send_window=bad), "send_window", field)
    for bad_value in (True, "09:00-20:00", None, 1):
        _problem(topic.enqueue(send_window=bad_value), "send_window")
    _problem(topic.enqueue(send_window=False, quiet_hours=False), "send_window")


def test_patch_moves_into_the_window_and_shows_the_time_asked(
        client: FlaskClient, auth: dict[str, str]) -> None:
    window = closed()
    topic = TopicClient(client, auth, send_window=window)
    opening = placed(window, now_ms())
    topic.enqueue(id="m", deliver_at=opening + MINUTE)
    asked = opening + 2 * MS_PER_HOUR  # past the window's end
    moved = client.patch(topic.url("/messages/m"), json={"deliver_at": asked},
                         headers=auth).get_json()
    assert parse_instant(moved["deliver_at"]) == placed(window, asked) > asked
    assert parse_instant(moved["requested_deliver_at"]) == asked
    back = client.patch(topic.url("/messages/m"), json={"deliver_at": opening + 5 * MINUTE},
                        headers=auth).get_json()
    assert parse_instant(back["deliver_at"]) == opening + 5 * MINUTE
    assert "requested_deliver_at" not in back
    now_asked = client.patch(topic.url("/messages/m"), json={"delay_ms": 0},
                             headers=auth).get_json()
    assert parse_instant(now_asked["deliver_at"]) == placed(window, now_ms())


def test_a_campaign_shift_moves_the_time_asked_then_places_it(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    window = closed()
    topic = TopicClient(client, auth, send_window=window)
    opening = placed(window, now_ms())
    inside = opening + 10 * MINUTE
    topic.batch([{"id": "c1", "campaign": "spring", "deliver_at": inside},
                 {"id": "c2", "campaign": "spring", "deliver_at": inside + MINUTE}])
    with running_operations(app.extensions["duetime"]):
        answer = client.patch(topic.url("/campaigns/spring"),
                              json={"shift_ms": 2 * MS_PER_HOUR}, headers=auth)
        assert answer.status_code == 202, answer.get_json()
        done = wait_operation(topic, answer.get_json()["operation"]["id"], 10)
    assert done["state"] == "succeeded" and done["changed"] == 2
    for message_id, asked in (("c1", inside), ("c2", inside + MINUTE)):
        got = topic.get(message_id).get_json()
        shifted = asked + 2 * MS_PER_HOUR  # past the window's end: the next day's opening
        assert parse_instant(got["deliver_at"]) == placed(window, shifted) > shifted
        assert parse_instant(got["requested_deliver_at"]) == shifted


def test_a_schedules_fire_is_placed_in_the_topics_window(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    window = closed()
    topic = TopicClient(client, auth, send_window=window)
    assert client.put(topic.url("/schedules/tick"), headers=auth, json={
        "cron": "* * * * * *", "timezone": "UTC", "payload": 1}).status_code == 201
    services: Services = app.extensions["duetime"]
    uid = topic_of(services, auth, topic.name).uid
    deadline = time.monotonic() + 10
    rows: dict[str, MessageState] = {}
    while not rows and time.monotonic() < deadline:  # listed first, then written
        ids = services.campaigns.members_after(uid, fires_index("tick"), "", 10)[0]
        rows = services.messages.get_many(uid, ids)
        time.sleep(0.2)
    assert client.delete(topic.url("/schedules/tick"), headers=auth).status_code == 204
    assert rows, "no fire produced within 10 s"
    row = next(iter(rows.values()))
    fire_ms = int(row.id.rsplit(":", 1)[1])
    assert row.requested_at_ms == fire_ms
    assert row.deliver_at_ms == placed(window, fire_ms) > fire_ms


def test_a_nack_delay_ending_outside_the_window_waits_for_the_opening(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    window = open_now()
    topic = TopicClient(client, auth, send_window=window)
    topic.enqueue(id="n")
    [leased] = topic.lease(1, wait_ms=3000)
    delay = 3 * MS_PER_HOUR  # past the window's end
    asked = now_ms() + delay
    answer = client.post(topic.url("/messages/n/nack"), headers=auth, json={
        "lease_token": leased["lease"]["token"], "delay_ms": delay})
    assert answer.status_code == 204, answer.get_json()
    row = _row(app, auth, topic, "n")
    assert row.state == "scheduled" and row.requested_at_ms is None
    assert row.due_at_ms == placed(window, row.due_at_ms) >= placed(window, asked) > asked
    assert row.due_at_ms - placed(window, asked) < 5_000
    assert parse_instant(topic.get("n").get_json()["deliver_at"]) == row.deliver_at_ms


def test_a_failed_posts_backoff_ending_outside_the_window_waits_for_the_opening(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    window = open_now(until_ms=MINUTE)  # closes within two minutes, reopens tomorrow
    with receiving(Receiver(lambda _id, _before: 500)) as target:
        topic = TopicClient(client, auth, send_window=window, retry={
            "backoff_seconds": 600, "max_backoff_seconds": 600},
            delivery={"mode": "webhook", "url": target.url, "timeout_seconds": 2})
        topic.enqueue(id="w")
        assert target.wait_distinct(1, 10)
        deadline = time.monotonic() + 10
        row = _row(app, auth, topic, "w")
        while row.state != "scheduled" and time.monotonic() < deadline:
            time.sleep(0.1)
            row = _row(app, auth, topic, "w")
    assert row.state == "scheduled" and row.attempts == 1, row
    # the backoff (300-600 s with jitter) ends after the window closed: tomorrow's opening
    opening = placed(window, now_ms() + 300_000)
    assert opening > now_ms() + 20 * MS_PER_HOUR
    assert row.due_at_ms == opening
    assert row.deliver_at_ms <= now_ms() and row.requested_at_ms is None


def test_the_spark_import_places_its_rows_by_the_topics_window(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    window = closed()
    topic = TopicClient(client, auth, send_window=window)
    services: Services = app.extensions["duetime"]
    now = now_ms()
    settings = ImportSettings(topic_of(services, auth, topic.name), None, now, 65536, 365, 7,
                              60_000)
    out = to_message({"recipient": "r1", "deliver_at": str(now), "payload": "1"}, settings)
    assert out["deliver_at"] == out["due_at"] == placed(window, now)
    assert out["requested_at"] == now
    inside = placed(window, now) + MINUTE
    kept = to_message({"recipient": "r2", "deliver_at": str(inside), "payload": "1"}, settings)
    assert kept["deliver_at"] == inside and kept["requested_at"] is None


def _next_dst_change(tz: ZoneInfo) -> dt.date:
    """The local date of tz's next change of UTC offset."""
    day = dt.datetime.now(tz).date()
    noon = dt.time(12)
    for _ in range(366):
        after = day + dt.timedelta(days=1)
        if (dt.datetime.combine(day, noon, tz).utcoffset()
                != dt.datetime.combine(after, noon, tz).utcoffset()):
            return after
        day = after
    raise AssertionError(f"{tz} changes no offset within a year")


def test_weekdays_across_a_dst_change_in_the_messages_zone(
        app: Flask, client: FlaskClient, auth: dict[str, str]) -> None:
    """Saturday noon before New York's next DST change goes to Monday 09:00 on New York's
    clock, at the other offset; a message with no zone takes the topic's (Europe/Berlin)."""
    topic = TopicClient(client, auth, timezone="Europe/Berlin", send_window={
        "days": ["MON", "TUE", "WED", "THU", "FRI"], "start": "09:00", "end": "20:00"})
    change = _next_dst_change(ZoneInfo("America/New_York"))
    saturday = change - dt.timedelta(days=(change.weekday() - 5) % 7 or 7)
    monday = saturday + dt.timedelta(days=2)
    asked = parse_local_time(f"{saturday}T12:00:00", "America/New_York")
    answer = topic.enqueue(id="ny", deliver_at=asked, timezone="America/New_York").get_json()
    opening = parse_local_time(f"{monday}T09:00:00", "America/New_York")
    assert parse_instant(answer["deliver_at"]) == opening
    assert opening - asked != 45 * MS_PER_HOUR  # an hour more or less: the offset changed
    berlin = parse_local_time(f"{saturday}T12:00:00", "Europe/Berlin")
    answer = topic.enqueue(id="de", deliver_at=berlin).get_json()
    assert parse_instant(answer["deliver_at"]) == parse_local_time(f"{monday}T09:00:00",
                                                                   "Europe/Berlin")
    # a move reads the zone the message was written with, not the topic's
    wednesday = parse_local_time(f"{monday + dt.timedelta(days=2)}T19:30:00",
                                 "America/New_York")  # 01:30 Thursday in Berlin: outside
    moved = client.patch(topic.url("/messages/ny"), json={"deliver_at": wednesday},
                         headers=auth).get_json()
    assert parse_instant(moved["deliver_at"]) == wednesday
    assert _row(app, auth, topic, "ny").timezone == "America/New_York"
