"""Send windows, pure: days, the end excluded, windows crossing midnight (named by the day they
open), DST gaps and folds in New York and Berlin, the stored form, bad windows, and against a
minute-by-minute reading of the wall clock: never earlier, always inside, no opening skipped.
No database."""

from __future__ import annotations

import datetime as dt
import random
from zoneinfo import ZoneInfo

import pytest

from app.core.send_window import SendWindow, WindowError
from app.core.timeparse import from_ms, parse_instant, parse_local_time

UTC = ZoneInfo("UTC")
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
WEEKDAYS = SendWindow.parse(["MON", "TUE", "WED", "THU", "FRI"], "09:00", "20:00")


def ny(local: str) -> int:
    return parse_local_time(local, "America/New_York")


@pytest.mark.parametrize(("due", "placed"), [
    ("2027-01-06T12:00:00Z", "2027-01-06T12:00:00Z"),  # a Wednesday noon: inside
    ("2027-01-06T09:00:00Z", "2027-01-06T09:00:00Z"),  # the start is inside
    ("2027-01-06T08:59:59.999Z", "2027-01-06T09:00:00Z"),
    ("2027-01-06T19:59:59.999Z", "2027-01-06T19:59:59.999Z"),
    ("2027-01-06T20:00:00Z", "2027-01-07T09:00:00Z"),  # the end is outside
    ("2027-01-08T20:00:00Z", "2027-01-11T09:00:00Z"),  # Friday evening: Monday
    ("2027-01-09T12:00:00Z", "2027-01-11T09:00:00Z"),  # Saturday: Monday
])
def test_weekdays_nine_to_eight(due: str, placed: str) -> None:
    assert WEEKDAYS.place(parse_instant(due), UTC) == parse_instant(placed)


def test_a_window_crossing_midnight_belongs_to_the_day_it_opens() -> None:
    nights = SendWindow.parse(["FRI"], "22:00", "06:00")
    friday, saturday = "2027-01-08", "2027-01-09"
    assert nights.place(parse_instant(f"{saturday}T05:59:00Z"), UTC) == parse_instant(
        f"{saturday}T05:59:00Z")  # Friday's night, after midnight
    assert nights.place(parse_instant(f"{friday}T05:59:00Z"), UTC) == parse_instant(
        f"{friday}T22:00:00Z")  # Thursday's night is not one of its days
    assert nights.place(parse_instant(f"{saturday}T06:00:00Z"), UTC) == parse_instant(
        "2027-01-15T22:00:00Z")  # the next Friday


def test_an_end_equal_to_the_start_is_open_the_whole_day() -> None:
    sundays = SendWindow.parse(["SUN"], "00:00", "00:00")
    assert sundays.place(parse_instant("2027-01-10T23:59:00Z"), UTC) == parse_instant(
        "2027-01-10T23:59:00Z")
    assert sundays.place(parse_instant("2027-01-11T00:00:00Z"), UTC) == parse_instant(
        "2027-01-17T00:00:00Z")


def test_the_zone_decides_the_days_too() -> None:
    # Friday 22:00 in New York is Saturday 03:00 UTC: inside there, outside in UTC
    friday_night = ny("2027-01-08T19:30:00")
    late = SendWindow.parse(["FRI"], "18:00", "23:00")
    assert late.place(friday_night, NEW_YORK) == friday_night
    assert late.place(friday_night, UTC) == parse_instant("2027-01-15T18:00:00Z")


def test_an_opening_in_a_dst_gap_moves_forward_by_the_gap() -> None:
    # New York springs forward on 2027-03-14 at 02:00 -> 03:00: 02:30 does not exist
    early = SendWindow.parse(["SUN"], "02:30", "05:00")
    placed = early.place(ny("2027-03-14T01:00:00"), NEW_YORK)
    assert placed == ny("2027-03-14T03:30:00")
    assert from_ms(placed).astimezone(NEW_YORK).utcoffset() == dt.timedelta(hours=-4)


def test_an_opening_emptied_by_a_dst_gap_is_no_opening() -> None:
    # 02:30-03:00 on 2027-03-14 resolves to 03:30-03:00: that day has none, the next has
    gap = SendWindow.parse(["SUN", "MON"], "02:30", "03:00")
    assert gap.place(ny("2027-03-14T01:00:00"), NEW_YORK) == ny("2027-03-15T02:30:00")


def test_an_opening_in_a_dst_fold_takes_its_first_occurrence() -> None:
    # New York falls back on 2026-11-01 at 02:00 -> 01:00: 01:30 exists twice
    fold = SendWindow.parse(["SUN"], "01:30", "06:00")
    placed = fold.place(ny("2026-11-01T00:00:00"), NEW_YORK)
    assert placed == parse_instant("2026-11-01T05:30:00Z")  # 01:30 EDT, the first one
    assert fold.place(placed, NEW_YORK) == placed


def test_weekdays_across_berlin_spring_forward_keep_the_wall_clock() -> None:
    # Saturday 2027-03-27 noon CET; Berlin moves to CEST on Sunday: Monday 09:00 is 07:00Z
    saturday = parse_local_time("2027-03-27T12:00:00", "Europe/Berlin")
    assert WEEKDAYS.place(saturday, BERLIN) == parse_instant("2027-03-29T07:00:00Z")
    friday_late = parse_local_time("2027-03-26T20:30:00", "Europe/Berlin")
    assert WEEKDAYS.place(friday_late, BERLIN) == parse_instant("2027-03-29T07:00:00Z")


def test_the_stored_form_reads_back_and_the_api_form_is_what_was_set() -> None:
    w = SendWindow.parse(["SAT", "MON"], "22:00", "06:30")
    assert w.text() == "MON,SAT 22:00-06:30"
    assert SendWindow.from_text(w.text()) == w
    assert w.api() == {"days": ["MON", "SAT"], "start": "22:00", "end": "06:30"}


@pytest.mark.parametrize(("days", "start", "end", "field"), [
    ([], "09:00", "20:00", "days"), (["MON", "Mon"], "09:00", "20:00", "days"),
    (["MON", "MON"], "09:00", "20:00", "days"), (["MON"], "9:00", "20:00", "start"),
    (["MON"], "09:00", "24:00", "end"), (["MON"], "09:00", "20:60", "end")])
def test_bad_windows_name_their_field(days: list[str], start: str, end: str,
                                      field: str) -> None:
    with pytest.raises(WindowError) as refused:
        SendWindow.parse(days, start, end)
    assert refused.value.field == field


def _inside(w: SendWindow, epoch_ms: int, tz: ZoneInfo) -> bool:
    """The window read off the wall clock directly (valid away from DST changes)."""
    wall = from_ms(epoch_ms).astimezone(tz)
    minute = wall.hour * 60 + wall.minute
    today, yesterday = wall.weekday(), (wall.weekday() - 1) % 7
    if w.start_min < w.end_min:
        return today in w.days and w.start_min <= minute < w.end_min
    return ((today in w.days and minute >= w.start_min)
            or (yesterday in w.days and minute < w.end_min))


def test_placement_against_the_wall_clock_minute_by_minute() -> None:
    rng = random.Random(85)
    start = parse_instant("2027-01-04T00:00:00Z")  # weeks without a DST change in either zone
    for _ in range(60):
        days = sorted(rng.sample(range(7), rng.randint(1, 7)))
        w = SendWindow(tuple(days), rng.randrange(0, 1440, 15), rng.randrange(0, 1440, 15))
        if w.start_min == w.end_min:
            continue
        tz = rng.choice([UTC, NEW_YORK, BERLIN])
        due = start + rng.randrange(0, 21 * 86_400_000, 60_000)
        placed = w.place(due, tz)
        assert placed >= due
        assert _inside(w, placed, tz)
        assert not any(_inside(w, t, tz) for t in range(due, placed, 60_000)) or placed == due
