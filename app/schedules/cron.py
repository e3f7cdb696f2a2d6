"""Fire times of a crontab on the wall clock of an IANA zone. Pure: no I/O; epoch ms.

The fields are APScheduler's (`CronTrigger`): 5 fields (minute hour day month day-of-week), or
6 with a leading seconds field. APScheduler enumerates the wall-clock times; each is resolved
to an instant by duetime's one rule for wall times (app.core.timeparse): a time in a DST gap moves
forward by the gap's length (02:30 on a 02:00 -> 03:00 night fires at 03:30), a time that
exists twice fires at its first occurrence only. An instant not after the one before it is
skipped, so fire times strictly increase and each wall time fires at most once a day.

Why not APScheduler's zone handling: in a fold its CronTrigger (3.11) fires both occurrences
and then returns the second one again and again (tests/test_cron.py shows it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from apscheduler.triggers.cron import CronTrigger

from app.core.timeparse import UTC, from_ms, resolve_wall_time, zone

# a wall time may resolve to an instant up to this far from the wall clock's reading
REWIND = dt.timedelta(hours=3)


class CronError(ValueError):
    """The expression is not a 5- or 6-field crontab; the message says what is wrong."""


class Cron:
    def __init__(self, expression: str, timezone: str) -> None:
        fields = expression.split()
        try:
            if len(fields) == 5:
                self.trigger = CronTrigger.from_crontab(expression, timezone=UTC)
            elif len(fields) == 6:
                second, minute, hour, day, month, weekday = fields
                self.trigger = CronTrigger(second=second, minute=minute, hour=hour, day=day,
                                           month=month, day_of_week=weekday, timezone=UTC)
            else:
                raise CronError(f"{len(fields)} fields; give 5 (minute hour day month "
                                "weekday) or 6 (second first)")
        except ValueError as exc:
            raise CronError(str(exc)) from exc
        self.zone = zone(timezone)

    def _walls(self, start: dt.datetime) -> Iterator[dt.datetime]:
        """Wall-clock fire times from start on (naive datetimes carried as UTC)."""
        wall = self.trigger.get_next_fire_time(None, start)
        while wall is not None:
            yield wall
            wall = self.trigger.get_next_fire_time(wall, wall + dt.timedelta(microseconds=1))

    def fires(self, after_ms: int) -> Iterator[int]:
        """Fire times strictly after after_ms, epoch ms, increasing (endless for most crons:
        the caller stops)."""
        moment = from_ms(after_ms)
        reading = moment.astimezone(self.zone).replace(tzinfo=UTC)
        # only near a change of the zone's offset can a wall time before the reading resolve
        # to an instant after it (a gap moves times forward)
        near_change = (moment - REWIND).astimezone(self.zone).utcoffset() != (
            moment + REWIND).astimezone(self.zone).utcoffset()
        last = after_ms
        for wall in self._walls(reading - REWIND if near_change else reading):
            instant = resolve_wall_time(wall.replace(tzinfo=None), self.zone)
            if instant > last:
                yield instant
                last = instant

    def next_after(self, after_ms: int) -> int | None:
        return next(self.fires(after_ms), None)
