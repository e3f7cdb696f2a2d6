"""Frequency caps' window arithmetic and stored form, pure (app.core.frequency_cap): when a
hand-out stops counting, on the recipient's wall clock, across DST changes."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from app.core.frequency_cap import CapError, FrequencyCap, next_midnight
from app.core.timeparse import format_ms, parse_instant

DAY = FrequencyCap(2, None, "defer")


def _end(cap: FrequencyCap, zone: str, at: str) -> str:
    return format_ms(cap.window_end(ZoneInfo(zone), parse_instant(at)))


@pytest.mark.parametrize(("zone", "at", "end"), [
    # an ordinary day
    ("America/New_York", "2027-01-06T15:00:00-05:00", "2027-01-07T05:00:00.000Z"),
    # the day clocks spring forward (2027-03-14 02:00 EST -> 03:00 EDT) is 23 hours long
    ("America/New_York", "2027-03-14T00:00:00-05:00", "2027-03-15T04:00:00.000Z"),
    ("America/New_York", "2027-03-14T23:59:59-04:00", "2027-03-15T04:00:00.000Z"),
    # the day clocks fall back (2027-11-07 02:00 EDT -> 01:00 EST) is 25 hours long
    ("America/New_York", "2027-11-07T00:00:00-04:00", "2027-11-08T05:00:00.000Z"),
    ("America/New_York", "2027-11-07T01:30:00-05:00", "2027-11-08T05:00:00.000Z"),
    # Berlin: 2027-03-28 02:00 CET -> 03:00 CEST
    ("Europe/Berlin", "2027-03-27T23:30:00+01:00", "2027-03-27T23:00:00.000Z"),
    ("Europe/Berlin", "2027-03-28T00:00:00+01:00", "2027-03-28T22:00:00.000Z"),
    # Santiago springs forward at midnight (2026-09-06 00:00 -04 -> 01:00 -03): the day
    # starts at 01:00, the first instant that exists
    ("America/Santiago", "2026-09-05T20:00:00-04:00", "2026-09-06T04:00:00.000Z"),
    # ... and falls back at midnight (2027-04-04 00:00 -03 -> 23:00 -04 on the 3rd): the
    # 3rd is 25 hours long, its last hour twice, and ends at the one midnight there is
    ("America/Santiago", "2027-04-03T22:00:00-03:00", "2027-04-04T04:00:00.000Z"),
    ("America/Santiago", "2027-04-03T23:30:00-04:00", "2027-04-04T04:00:00.000Z"),
    ("Asia/Kolkata", "2027-01-06T23:59:59.999+05:30", "2027-01-06T18:30:00.000Z"),
])
def test_a_day_ends_at_the_next_local_midnight(zone: str, at: str, end: str) -> None:
    assert _end(DAY, zone, at) == end


def test_the_end_is_always_after_now_minute_by_minute_across_a_year_of_dst() -> None:
    """Every minute around each change of three zones: the end is after now, is a moment
    whose wall date is later, and the wall date just before it is the one of now."""
    for zone in ("America/New_York", "Europe/Berlin", "America/Santiago"):
        tz = ZoneInfo(zone)
        for start in ("2027-03-13T00:00:00Z", "2027-11-06T00:00:00Z", "2027-04-02T00:00:00Z",
                      "2026-09-05T00:00:00Z", "2027-03-27T00:00:00Z",
                      "2027-10-30T00:00:00Z"):
            base = parse_instant(start)
            for minute in range(0, 3 * 1440, 7):
                now = base + minute * 60_000
                end = next_midnight(tz, now)
                wall = dt.datetime.fromtimestamp(now / 1000, tz).date()
                assert end > now
                assert dt.datetime.fromtimestamp(end / 1000, tz).date() > wall or (
                    dt.datetime.fromtimestamp(end / 1000, tz).time() == dt.time(0))
                assert dt.datetime.fromtimestamp((end - 1) / 1000, tz).date() == wall
                assert end - now <= 25 * 3_600_000


def test_a_rolling_window_counts_hours_after_the_hand_out() -> None:
    cap = FrequencyCap(3, 6, "drop")
    assert cap.window_end(ZoneInfo("UTC"), 1_000) == 1_000 + 6 * 3_600_000
    # DST does not stretch it: elapsed hours, not wall hours
    at = "2027-03-14T01:30:00-05:00"
    assert _end(cap, "America/New_York", at) == "2027-03-14T12:30:00.000Z"


@pytest.mark.parametrize("cap", [FrequencyCap(2, None, "defer"), FrequencyCap(100, 744, "drop"),
                                 FrequencyCap(1, 1, "defer")])
def test_the_stored_form_reads_back(cap: FrequencyCap) -> None:
    assert FrequencyCap.from_text(cap.text()) == cap
    shown = cap.api()
    assert FrequencyCap.parse(shown["max"], shown["per"], shown.get("hours"),  # type: ignore[arg-type]
                              shown["on_cap"]) == cap  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "field"), [
    ((0, "day", None, "defer"), "max"), ((101, "day", None, "defer"), "max"),
    ((2, "week", None, "defer"), "per"), ((2, "day", 3, "defer"), "hours"),
    ((2, "hours", None, "defer"), "hours"), ((2, "hours", 0, "defer"), "hours"),
    ((2, "hours", 745, "drop"), "hours"), ((2, "day", None, "queue"), "on_cap"),
])
def test_a_cap_that_cannot_be_names_its_field(args: tuple, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(CapError) as caught:
        FrequencyCap.parse(*args)
    assert caught.value.field == field
