"""Send windows: the wall-clock hours, on chosen weekdays, in which a message may be due. Pure:
no I/O; every time is epoch ms.

A window opens at `start` on each of its `days` and closes at `end`, on the wall clock of
one zone: [start, end), the end itself outside. An end at or before the start crosses
midnight: the window opens on the day named in `days` and closes on the next (FRI
22:00-06:00 holds Saturday 05:59, not Friday 05:59). An end equal to the start keeps it open
24 hours. A time outside every opening goes to the next opening's start (place()).

Wall times resolve as every wall time in duetime (app.core.timeparse.resolve_wall_time): one
in a DST gap moves forward by the gap's length, one that exists twice (a fold) takes its
first occurrence. An opening whose end so resolves at or before its start (a window inside a
gap) is no opening that day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from app.core.timeparse import MAX_MS, MIN_MS, from_ms, resolve_wall_time

DAYS = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
HH_MM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
_TEXT = re.compile(r"^([A-Z,]+) ([0-9:]+)-([0-9:]+)$")
MINUTES_A_DAY = 1440
_EDGE_MS = 10 * 86_400_000


class WindowError(ValueError):
    """A window that cannot be: `field` names the part that is wrong (days, start, end)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def minute_of(field: str, text: str) -> int:
    """ "HH:MM" (00:00 to 23:59) → minutes after midnight; WindowError naming field."""
    found = HH_MM.match(text)
    if found is None:
        raise WindowError(field, f"must be HH:MM (00:00 to 23:59): {text[:16]!r}")
    return int(found.group(1)) * 60 + int(found.group(2))


def hh_mm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


@dataclasses.dataclass(frozen=True)
class SendWindow:
    """Open from start_min to end_min (minutes after local midnight) on each weekday of
    `days` (0 = Monday), crossing midnight when end_min <= start_min."""

    days: tuple[int, ...]
    start_min: int
    end_min: int

    @classmethod
    def parse(cls, days: Sequence[str], start: str, end: str) -> SendWindow:
        """From the API's form; WindowError naming the field for no days, an unknown or
        repeated day, or a time that is not HH:MM."""
        if not days:
            raise WindowError("days", "name at least one day (MON to SUN)")
        unknown = [d for d in days if d not in DAYS]
        if unknown:
            raise WindowError("days", f"not a day (MON to SUN): {str(unknown[0])[:16]!r}")
        if len(set(days)) != len(days):
            raise WindowError("days", "a day is named twice")
        return cls(tuple(sorted(DAYS.index(d) for d in days)), minute_of("start", start),
                   minute_of("end", end))

    @classmethod
    def every_day(cls, start_min: int, end_min: int) -> SendWindow:
        return cls(tuple(range(7)), start_min, end_min)

    def api(self) -> dict[str, object]:
        """The API's form: {days, start, end}."""
        return {"days": [DAYS[d] for d in self.days], "start": hh_mm(self.start_min),
                "end": hh_mm(self.end_min)}

    def text(self) -> str:
        """The stored form, e.g. "MON,TUE 09:00-20:00" (from_text reads it back)."""
        days = ",".join(DAYS[d] for d in self.days)
        return f"{days} {hh_mm(self.start_min)}-{hh_mm(self.end_min)}"

    @classmethod
    def from_text(cls, text: str) -> SendWindow:
        found = _TEXT.match(text)
        if found is None:
            raise WindowError("send_window", f"not a stored window: {text[:40]!r}")
        return cls.parse(found.group(1).split(","), found.group(2), found.group(3))

    def _length_min(self) -> int:
        return (self.end_min - self.start_min) % MINUTES_A_DAY or MINUTES_A_DAY

    def opening(self, day: dt.date, tz: ZoneInfo) -> tuple[int, int] | None:
        """[opens, closes) of the window that opens on this local day, or None (not one of
        its days, or resolved empty by a DST gap)."""
        if day.weekday() not in self.days:
            return None
        start = dt.datetime.combine(day, dt.time()) + dt.timedelta(minutes=self.start_min)
        opens = resolve_wall_time(start, tz)
        closes = resolve_wall_time(start + dt.timedelta(minutes=self._length_min()), tz)
        return (opens, closes) if closes > opens else None

    def place(self, due_ms: int, tz: ZoneInfo) -> int:
        """due_ms when it falls inside an opening, else the start of the first opening
        after it (within 8 days: every week has one). A time within 10 days of the years 1
        and 9999 that duetime reads is left as it is (no calendar beyond them to place it
        on)."""
        if not MIN_MS + _EDGE_MS <= due_ms <= MAX_MS - _EDGE_MS:
            return due_ms
        today = from_ms(due_ms).astimezone(tz).date()
        first: int | None = None
        for offset in range(-1, 9):  # yesterday's opening may cross midnight into today
            found = self.opening(today + dt.timedelta(days=offset), tz)
            if found is None:
                continue
            opens, closes = found
            if opens <= due_ms < closes:
                return due_ms
            if opens > due_ms and (first is None or opens < first):
                first = opens
        if first is None:
            raise AssertionError("a window with a day opens within every 8 days")
        return first
