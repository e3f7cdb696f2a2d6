"""Recipient time on the real node: a topic's quiet hours place messages at their end (in the
message's own zone when it has one; `quiet_hours: false` exempts one), bad windows are 400s
naming the field, and /stats?window=hour counts the next 7 days per hour under cancels."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from flask.testing import FlaskClient

from app.core.timeline import MS_PER_HOUR
from app.core.timeparse import format_ms, parse_instant
from app.messages.send_windows import quiet_hours_window
from tests.consumers import TopicClient, now_ms


def _hhmm(epoch_ms: int) -> str:
    minute = epoch_ms // 60_000 % 1440
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _problem(answer: Any, field: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.get_json()
    assert answer.mimetype == "application/problem+json"
    body: dict[str, Any] = answer.get_json()
    assert field in body["errors"], body
    return body


def test_a_message_due_inside_quiet_hours_is_placed_at_their_end(
        client: FlaskClient, auth: dict[str, str]) -> None:
    now = now_ms()
    window = {"start": _hhmm(now - MS_PER_HOUR), "end": _hhmm(now + MS_PER_HOUR),
              "timezone": "UTC"}
    topic = TopicClient(client, auth, quiet_hours=window)
    assert client.get(topic.url(), headers=auth).get_json()["quiet_hours"] == window
    expected = quiet_hours_window(window["start"], window["end"]).place(now, ZoneInfo("UTC"))
    assert expected > now + MS_PER_HOUR - 60_000
    held = topic.enqueue(id="held").get_json()
    assert parse_instant(held["deliver_at"]) == expected
    assert parse_instant(topic.get("held").get_json()["deliver_at"]) == expected
    urgent = topic.enqueue(id="urgent", quiet_hours=False).get_json()
    assert parse_instant(urgent["deliver_at"]) <= now_ms()
    # 12 hours away on the message's own wall clock: outside the window there
    away = topic.enqueue(id="away", timezone="Etc/GMT+12").get_json()
    assert parse_instant(away["deliver_at"]) <= now_ms()
    assert [m["id"] for m in topic.lease(10, wait_ms=2000)] in (["urgent", "away"],
                                                                ["away", "urgent"])


def test_quiet_hours_that_wrap_midnight_hold_the_night(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, quiet_hours={"start": "22:00", "end": "06:00",
                                                   "timezone": "Europe/Bucharest"})
    day = (now_ms() // 86_400_000 + 2) * 86_400_000  # midnight UTC, the day after tomorrow
    late = day + 21 * MS_PER_HOUR + 30 * 60_000  # 23:30 in Bucharest (winter, +02:00)
    answer = topic.enqueue(deliver_at=format_ms(late)).get_json()
    assert parse_instant(answer["deliver_at"]) == day + 28 * MS_PER_HOUR  # 06:00 next day
    evening = day + 18 * MS_PER_HOUR  # 20:00 in Bucharest: outside
    assert parse_instant(topic.enqueue(deliver_at=evening).get_json()["deliver_at"]) == evening
    local = topic.enqueue(local_time="2027-01-05T02:00:00", timezone="Europe/Bucharest")
    assert parse_instant(local.get_json()["deliver_at"]) == parse_instant(
        "2027-01-05T06:00:00+02:00")
    removed = client.put(topic.url(), json={"quiet_hours": None}, headers=auth)
    assert removed.status_code == 200 and removed.get_json()["quiet_hours"] is None
    assert parse_instant(topic.enqueue(deliver_at=late).get_json()["deliver_at"]) == late


def test_bad_quiet_hours_and_zones_are_problems_naming_the_field(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    for bad, field in (({"start": "9:00", "end": "08:00"}, "start"),
                       ({"start": "21:00", "end": "24:00"}, "end"),
                       ({"start": "21:00", "end": "08:00", "timezone": "Mars/Base"},
                        "timezone"),
                       ({"start": "21:00"}, "end")):
        body = _problem(client.put(topic.url(), json={"quiet_hours": bad}, headers=auth),
                        "quiet_hours")
        assert field in body["errors"]["quiet_hours"], body
    _problem(topic.enqueue(timezone="Mars/Base"), "timezone")
    _problem(topic.enqueue(local_time="2027-01-05T02:00:00"), "timezone")


def test_stats_per_hour_count_the_next_seven_days_under_cancels(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    now = now_ms()
    hour = now - now % MS_PER_HOUR
    results = topic.batch([{"deliver_at": hour + 2 * MS_PER_HOUR + 60_000 * i}
                           for i in range(3)]
                          + [{"deliver_at": hour + 30 * MS_PER_HOUR} for _ in range(2)]
                          + [{"deliver_at": hour + 8 * 24 * MS_PER_HOUR}])
    assert client.delete(topic.url(f"/messages/{results[0]['id']}"),
                         headers=auth).status_code == 204
    stats = client.get(topic.url("/stats?window=hour"), headers=auth).get_json()
    windows = stats["upcoming"]
    assert len(windows) == 168 and parse_instant(windows[0]["from"]) == hour
    assert parse_instant(windows[-1]["to"]) == hour + 168 * MS_PER_HOUR
    counted = {(parse_instant(w["from"]) - hour) // MS_PER_HOUR: w["count"] for w in windows
               if w["count"]}
    assert counted == {2: 2, 30: 2}  # the one 8 days ahead lies beyond the 7 days
    minutes = client.get(topic.url("/stats"), headers=auth).get_json()["upcoming"]
    assert len(minutes) == 60 and sum(w["count"] for w in minutes) == 0
    _problem(client.get(topic.url("/stats?window=week"), headers=auth), "window")
