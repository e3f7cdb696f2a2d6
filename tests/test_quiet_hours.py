"""Quiet hours, pure: the older spelling of a send window (quiet [start, end) daily is the
window [end, start) every day) places as quiet hours always did: windows that wrap midnight,
DST at their end, bad input. No database."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import pytest

from app.core.send_window import WindowError
from app.core.timeparse import parse_instant, parse_local_time
from app.messages.send_windows import quiet_hours_window

UTC = ZoneInfo("UTC")
BUCHAREST = ZoneInfo("Europe/Bucharest")
NIGHT = quiet_hours_window("21:00", "08:00")


def utc(text: str) -> int:
    return parse_instant(text)


@pytest.mark.parametrize(("due", "placed"), [
    ("2026-12-01T20:59:59.999Z", "2026-12-01T20:59:59.999Z"),  # before the window
    ("2026-12-01T21:00:00.000Z", "2026-12-02T08:00:00.000Z"),  # its first minute
    ("2026-12-01T23:30:00.000Z", "2026-12-02T08:00:00.000Z"),  # before midnight
    ("2026-12-02T00:00:00.000Z", "2026-12-02T08:00:00.000Z"),  # after midnight
    ("2026-12-02T07:59:59.999Z", "2026-12-02T08:00:00.000Z"),  # its last moment
    ("2026-12-02T08:00:00.000Z", "2026-12-02T08:00:00.000Z"),  # the end is outside
    ("2026-12-02T12:00:00.000Z", "2026-12-02T12:00:00.000Z"),  # the day
])
def test_a_window_that_wraps_midnight(due: str, placed: str) -> None:
    assert NIGHT.place(utc(due), UTC) == utc(placed)


def test_a_window_within_one_day() -> None:
    lunch = quiet_hours_window("12:00", "13:30")
    assert lunch.place(utc("2026-12-01T12:45:00Z"), UTC) == utc("2026-12-01T13:30:00Z")
    assert lunch.place(utc("2026-12-01T13:30:00Z"), UTC) == utc("2026-12-01T13:30:00Z")
    assert lunch.place(utc("2026-12-01T11:59:00Z"), UTC) == utc("2026-12-01T11:59:00Z")


def test_the_zone_decides_where_the_night_is() -> None:
    # 06:00 UTC is 08:00 in Bucharest (winter, +02:00): outside there, inside in UTC
    due = utc("2026-12-01T06:00:00Z")
    assert NIGHT.place(due, BUCHAREST) == due
    assert NIGHT.place(due, UTC) == utc("2026-12-01T08:00:00Z")
    # 05:00 UTC is 07:00 in Bucharest: placed at 08:00 Bucharest = 06:00 UTC
    assert NIGHT.place(utc("2026-12-01T05:00:00Z"), BUCHAREST) == utc("2026-12-01T06:00:00Z")
    # a 09:00 local send to New York at 02:00 local, inside: 08:00 local that morning
    ny = parse_local_time("2026-12-01T02:00:00", "America/New_York")
    assert NIGHT.place(ny, ZoneInfo("America/New_York")) == parse_local_time(
        "2026-12-01T08:00:00", "America/New_York")


def test_an_end_in_a_dst_gap_moves_forward_by_the_gap() -> None:
    # Bucharest springs forward on 2026-03-29 at 03:00 -> 04:00: 03:30 does not exist
    early = quiet_hours_window("01:00", "03:30")
    due = parse_local_time("2026-03-29T02:00:00", "Europe/Bucharest")
    assert early.place(due, BUCHAREST) == parse_local_time("2026-03-29T04:30:00",
                                                           "Europe/Bucharest")


def test_an_end_in_a_dst_fold_takes_its_first_occurrence() -> None:
    # Bucharest falls back on 2026-10-25 at 04:00 -> 03:00: 03:30 exists twice
    early = quiet_hours_window("01:00", "03:30")
    due = parse_local_time("2026-10-25T02:00:00", "Europe/Bucharest")
    placed = early.place(due, BUCHAREST)
    assert placed == utc("2026-10-25T00:30:00Z")  # 03:30 at +03:00, the first one
    assert early.place(placed, BUCHAREST) == placed


def test_an_empty_window_holds_nothing() -> None:
    never = quiet_hours_window("09:00", "09:00")
    for due in ("2026-12-01T09:00:00Z", "2026-12-01T08:59:59.999Z", "2026-12-01T21:00:00Z"):
        assert never.place(utc(due), UTC) == utc(due)


@pytest.mark.parametrize(("start", "end", "field"), [
    ("9:00", "08:00", "start"), ("21:00", "24:00", "end"), ("21:60", "08:00", "start"),
    ("", "08:00", "start")])
def test_bad_windows_are_refused(start: str, end: str, field: str) -> None:
    with pytest.raises(WindowError) as refused:
        quiet_hours_window(start, end)
    assert refused.value.field == field
