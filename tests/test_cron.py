"""Cron fire times and misfires, pure (the clock injected): 5 and 6 fields, time zones, both
DST changes (the rule of app.schedules.cron, checked against APScheduler's own zone handling), the
misfire rules, bad expressions."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger

from app.core.timeparse import parse_instant, parse_local_time
from app.schedules.cron import Cron, CronError
from app.schedules.manage import plan


def take(cron: Cron, after: int, n: int) -> list[int]:
    return list(itertools.islice(cron.fires(after), n))


def local(text: str, tz: str) -> int:
    return parse_local_time(text, tz)


def test_weekdays_at_nine_in_bucharest() -> None:
    cron = Cron("0 9 * * MON-FRI", "Europe/Bucharest")
    fires = take(cron, parse_instant("2026-12-04T12:00:00Z"), 3)  # a Friday afternoon
    assert fires == [local("2026-12-07T09:00:00", "Europe/Bucharest"),
                     local("2026-12-08T09:00:00", "Europe/Bucharest"),
                     local("2026-12-09T09:00:00", "Europe/Bucharest")]


def test_six_fields_fire_every_two_seconds() -> None:
    start = parse_instant("2026-12-01T10:00:00.500Z")
    fires = take(Cron("*/2 * * * * *", "UTC"), start, 4)
    assert fires == [start + 1500, start + 3500, start + 5500, start + 7500]


def test_daily_0930_in_bucharest_fires_once_a_day_through_both_changes() -> None:
    cron = Cron("30 9 * * *", "Europe/Bucharest")
    for first_day in ("2026-03-27", "2026-10-23"):  # around spring forward and fall back
        start = local(f"{first_day}T12:00:00", "Europe/Bucharest")
        fires = take(cron, start, 5)
        days = [dt.datetime.fromtimestamp(f / 1000, ZoneInfo("Europe/Bucharest")) for f in fires]
        assert [(d.hour, d.minute) for d in days] == [(9, 30)] * 5
        assert len({d.date() for d in days}) == 5


def test_a_time_in_the_spring_gap_fires_once_the_gap_later() -> None:
    # New York 2026-03-08: 02:00 -> 03:00, so 02:30 does not exist
    cron = Cron("30 2 * * *", "America/New_York")
    fires = take(cron, local("2026-03-07T12:00:00", "America/New_York"), 3)
    assert fires == [parse_instant("2026-03-08T07:30:00Z"),  # 03:30 EDT
                     local("2026-03-09T02:30:00", "America/New_York"),
                     local("2026-03-10T02:30:00", "America/New_York")]
    # APScheduler's own zone handling agrees in the gap
    theirs = CronTrigger.from_crontab("30 2 * * *", timezone=ZoneInfo("America/New_York"))
    first = theirs.get_next_fire_time(None, dt.datetime(2026, 3, 7, 12, tzinfo=dt.UTC))
    assert first is not None and first.astimezone(dt.UTC) == dt.datetime(
        2026, 3, 8, 7, 30, tzinfo=dt.UTC)


def test_a_time_in_the_fall_fold_fires_at_its_first_occurrence_only() -> None:
    # New York 2026-11-01: 02:00 -> 01:00, so 01:30 exists twice
    cron = Cron("30 1 * * *", "America/New_York")
    fires = take(cron, local("2026-10-31T12:00:00", "America/New_York"), 3)
    assert fires == [parse_instant("2026-11-01T05:30:00Z"),  # 01:30 EDT, the first one
                     local("2026-11-02T01:30:00", "America/New_York"),
                     local("2026-11-03T01:30:00", "America/New_York")]
    # APScheduler's zone handling fires the second 01:30 too, then returns it again and
    # again: the reason app.schedules.cron resolves wall times itself
    theirs = CronTrigger.from_crontab("30 1 * * *", timezone=ZoneInfo("America/New_York"))
    now = dt.datetime(2026, 10, 31, 16, tzinfo=dt.UTC)
    seen, previous = [], None
    for _ in range(3):
        fire = theirs.get_next_fire_time(previous, now)
        assert fire is not None
        seen.append(fire.astimezone(dt.UTC))
        previous, now = fire, fire + dt.timedelta(microseconds=1)
    assert seen[1] == seen[2] == dt.datetime(2026, 11, 1, 6, 30, tzinfo=dt.UTC)


def test_every_thirty_minutes_through_the_fold_never_goes_back() -> None:
    cron = Cron("*/30 * * * *", "America/New_York")
    fires = take(cron, parse_instant("2026-11-01T04:10:00Z"), 6)  # 00:10 EDT
    assert fires == sorted(set(fires))
    assert fires[:3] == [parse_instant(t) for t in (
        "2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z")]
    assert fires[3] == parse_instant("2026-11-01T07:00:00Z")  # 02:00 EST: 01:00 and 01:30 EST
    # are second occurrences of wall times already fired


@pytest.mark.parametrize(("expression", "tz"), [
    ("61 * * * *", "UTC"), ("* * *", "UTC"), ("* * * * * * *", "UTC"),
    ("0 9 * * FUNDAY", "UTC"), ("0 25 * * *", "UTC")])
def test_bad_expressions_are_refused(expression: str, tz: str) -> None:
    with pytest.raises(CronError):
        Cron(expression, tz)


def test_a_daily_0230_on_the_fall_back_day_fires_once() -> None:
    # New York 2026-11-01: 02:00 EDT -> 01:00 EST; 02:30 EST exists once that night
    fires = take(Cron("30 2 * * *", "America/New_York"),
                 local("2026-10-31T12:00:00", "America/New_York"), 2)
    assert fires == [parse_instant("2026-11-01T07:30:00Z"),
                     local("2026-11-02T02:30:00", "America/New_York")]


@pytest.mark.parametrize(("misfire", "made"), [
    ("fire_once", [8_000, 10_000, 12_000, 14_000]), ("skip", [10_000, 12_000, 14_000])])
def test_misfires_with_an_injected_clock(misfire: str, made: list[int]) -> None:
    # fires every 2 s from 2 s on; now = 11 s: those before 10 s (the 1 s grace) were missed
    fires = [2_000, 4_000, 6_000, 8_000, 10_000, 12_000, 14_000]
    assert plan(fires, 11_000, misfire) == made
    assert plan(fires[4:], 11_000, misfire) == fires[4:]  # none missed: all of them
    assert plan([], 11_000, misfire) == []
