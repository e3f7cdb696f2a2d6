"""Quiet hours: a daily wall-clock window in which no message of a topic may be due. Pure: no
I/O; every time is epoch ms.

A window is [start, end) on the wall clock of a zone, and wraps midnight when end <= start
(21:00-08:00 holds 23:30 and 07:59, not 08:00). A message due inside it is placed at the
window's end, on the same wall clock: the next 08:00 in that zone after its due time. The end
is resolved as every wall time in duetime (app.core.timeparse): an end that falls in a DST gap
moves forward by the gap's length, one that exists twice takes its first occurrence. Which
zone: the message's own `timezone` when it has one, else the window's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

from app.core.timeparse import TimeFormatError, from_ms, resolve_wall_time, zone
from app.models import TopicSettings

HH_MM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


@dataclasses.dataclass(frozen=True)
class QuietHours:
    """A daily window [start, end) in minutes after midnight, on the wall clock of `timezone`
    (an IANA name) unless a message names its own."""

    start_min: int
    end_min: int
    timezone: str

    @classmethod
    def parse(cls, start: str, end: str, timezone: str) -> QuietHours:
        """From "HH:MM" texts; TimeFormatError naming what is wrong."""
        minutes = []
        for name, text in (("start", start), ("end", end)):
            found = HH_MM.match(text)
            if found is None:
                raise TimeFormatError(f"{name} must be HH:MM (00:00 to 23:59): {text!r}")
            minutes.append(int(found.group(1)) * 60 + int(found.group(2)))
        zone(timezone)  # raises for an unknown zone
        return cls(minutes[0], minutes[1], timezone)

    def text(self, minute: int) -> str:
        return f"{minute // 60:02d}:{minute % 60:02d}"

    def holds(self, wall_minute: int) -> bool:
        """Is this minute of the day inside the window?"""
        if self.start_min < self.end_min:
            return self.start_min <= wall_minute < self.end_min
        return wall_minute >= self.start_min or wall_minute < self.end_min

    def place(self, due_ms: int, message_zone: str | None = None) -> int:
        """Where a message due at due_ms goes: due_ms itself outside the window, else the
        window's end (the first end on that wall clock after due_ms)."""
        if self.start_min == self.end_min:
            return due_ms  # an empty window
        tz = zone(message_zone or self.timezone)
        wall = from_ms(due_ms).astimezone(tz)
        if not self.holds(wall.hour * 60 + wall.minute):
            return due_ms
        end = wall.replace(hour=self.end_min // 60, minute=self.end_min % 60, second=0,
                           microsecond=0, tzinfo=None)
        for _ in range(2):  # the end is today or tomorrow, on the wall clock
            placed = resolve_wall_time(end, tz)
            if placed > due_ms:
                return placed
            end += dt.timedelta(days=1)
        raise AssertionError("a window end lies within a day of every time inside it")


def of_topic(settings: TopicSettings) -> QuietHours | None:
    """The topic's quiet hours, if it has any."""
    if settings.quiet_start is None or settings.quiet_end is None:
        return None
    return QuietHours.parse(settings.quiet_start, settings.quiet_end,
                            settings.quiet_timezone or "UTC")
