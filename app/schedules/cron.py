"""Fire times of a crontab on the wall clock of an IANA zone. Pure: no I/O; epoch ms.

The grammar is the standard (Vixie) crontab's, stated once as a regular expression (PATTERN,
the `pattern` of the schedule's `cron` in openapi.yaml) and checked here first: any string it
admits is a schedule the server takes. 5 fields, minute (0-59) hour (0-23) day of month
(1-31) month (1-12 or JAN-DEC) day of week (0-7 or SUN-SAT, 0 and 7 both Sunday), or 6 with a
leading seconds field (0-59); fields apart by spaces or tabs. A field is a list (`,`) of `*`,
a value or a range `a-b`, each optionally with a step `/n` (1-99); names in any case. A range
whose end comes before its start wraps around (hours `22-2` are 22, 23, 0, 1, 2; `FRI-MON` is
Friday to Monday). As in Vixie cron, when both the day of month and the day of week are
restricted (neither starts with `*`), a day matching either fires; otherwise both must match.
A day that no month named has (`0 0 31 2 *`) makes a schedule that never fires.

Each field is expanded to its values and handed to APScheduler's `CronTrigger` (weekdays by
name: its numbers start on Monday), which enumerates the wall-clock times; each is resolved
to an instant by duetime's one rule for wall times (app.core.timeparse): a time in a DST gap
moves forward by the gap's length (02:30 on a 02:00 -> 03:00 night fires at 03:30), a time
that exists twice fires at its first occurrence only. An instant not after the one before it
is skipped, so fire times strictly increase and each wall time fires at most once a day.

Why not APScheduler's zone handling: in a fold its CronTrigger (3.11) fires both occurrences
and then returns the second one again and again (tests/test_cron.py shows it).
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import re
from collections.abc import Iterator

from apscheduler.triggers.cron import CronTrigger

from app.core.timeparse import MAX_MS, UTC, from_ms, resolve_wall_time, zone

# a wall time may resolve to an instant up to this far from the wall clock's reading
REWIND = dt.timedelta(hours=3)

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_APS_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _any_case(name: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" for c in name)


def _field(value: str) -> str:
    """The regex of one field whose single values match `value`: a list of `*`, values and
    ranges, each with an optional step."""
    step = "(/[1-9][0-9]?)?"
    item = rf"(\*|({value})(-({value}))?){step}"
    return f"{item}(,{item})*"


_SIXTY = "[0-5]?[0-9]"
_MONTH = "|".join(["0?[1-9]|1[0-2]", *(_any_case(m) for m in MONTHS)])
_WEEKDAY = "|".join(["[0-7]", *(_any_case(d) for d in WEEKDAYS)])
# (name, regex of one value, lowest, highest) of the 5 standard fields
_FIELDS = (("minute", _SIXTY, 0, 59), ("hour", "[01]?[0-9]|2[0-3]", 0, 23),
           ("day", "0?[1-9]|[12][0-9]|3[01]", 1, 31), ("month", _MONTH, 1, 12),
           ("weekday", _WEEKDAY, 0, 7))
_SEP = "[ \t]+"
PATTERN = (f"^({_field(_SIXTY)}{_SEP})?"
           + _SEP.join(_field(value) for _, value, _, _ in _FIELDS) + "$")
_COMPILED = re.compile(PATTERN)


class CronError(ValueError):
    """The expression is not a crontab of PATTERN; the message says what is wrong."""


def _number(text: str, names: tuple[str, ...], base: int) -> int:
    upper = text.upper()
    return names.index(upper) + base if upper in names else int(text)


def _values(text: str, low: int, high: int, names: tuple[str, ...] = (),
            base: int = 0) -> list[int]:
    """The values (low..high) of a field PATTERN admitted. A range whose end comes before its
    start wraps around; `a/n` is a to high in steps of n. A value above high is the cycle's
    first again (a weekday's 7, Sunday, is 0)."""
    span = high - low + 1
    found: set[int] = set()
    for item in text.split(","):
        part, slash, step_text = item.partition("/")
        step = int(step_text) if slash else 1
        if part == "*":
            start, end = low, high
        else:
            first, dash, last = part.partition("-")
            start = _number(first, names, base)
            end = _number(last, names, base) if dash else (high if slash else start)
            if start > high:  # Sunday as 7 begins the range: it is 0
                start, end = start - span, end - span if end > high else end
        run = (list(range(start, end + 1)) if end >= start
               else [*range(start, high + 1), *range(low, end + 1)])
        found.update(v - span if v > high else v for v in run[::step])
    return sorted(found)


def parse(expression: str) -> dict[str, list[int]]:
    """The values of each field (second, minute, hour, day, month, weekday with 0 Sunday) of
    an expression PATTERN admits, and the keys `day_star`/`weekday_star` ([1] when that
    field starts with `*`); CronError when PATTERN does not admit it."""
    if not isinstance(expression, str) or not _COMPILED.fullmatch(expression):
        raise CronError("not a crontab: 5 fields (minute hour day month weekday) or 6 "
                        "(seconds first), each a list of *, values (names for months and "
                        "weekdays) or ranges, with optional /steps")
    texts = expression.split()
    second = _values(texts.pop(0), 0, 59) if len(texts) == 6 else [0]
    minute, hour, day, month, weekday = texts
    return {"second": second, "minute": _values(minute, 0, 59), "hour": _values(hour, 0, 23),
            "day": _values(day, 1, 31), "month": _values(month, 1, 12, MONTHS, 1),
            "weekday": _values(weekday, 0, 6, WEEKDAYS),
            "day_star": [int(day.startswith("*"))],
            "weekday_star": [int(weekday.startswith("*"))]}


def _listed(values: list[int]) -> str:
    """Values as APScheduler's expression, short (it looks at each part of a list on every
    step): `a-b/n` for an even run of three or more, else runs `a-b` and single values."""
    if len(values) > 2 and len({b - a for a, b in itertools.pairwise(values)}) == 1:
        step = values[1] - values[0]
        return f"{values[0]}-{values[-1]}" + (f"/{step}" if step > 1 else "")
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


class Cron:
    def __init__(self, expression: str, timezone: str) -> None:
        fields = parse(expression)
        weekdays = ",".join(_APS_WEEKDAYS[v] for v in fields["weekday"])
        if fields["day_star"][0] or fields["weekday_star"][0]:
            shapes = [(fields["day"], weekdays)]  # both must match
        else:  # both restricted: a day matching either fires (Vixie)
            shapes = [(fields["day"], "*"), (list(range(1, 32)), weekdays)]
        # a shape whose days no month named has never fires (APScheduler would look up to
        # the year 9999 to find that out)
        self.triggers = [
            CronTrigger(second=_listed(fields["second"]), minute=_listed(fields["minute"]),
                        hour=_listed(fields["hour"]), day=_listed(days),
                        month=_listed(fields["month"]), day_of_week=on, timezone=UTC)
            for days, on in shapes
            if any(d <= _DAYS_IN_MONTH[m - 1] for d in days for m in fields["month"])]
        self.zone = zone(timezone)

    def _walls(self, start: dt.datetime) -> Iterator[dt.datetime]:
        """Wall-clock fire times from start on (naive datetimes carried as UTC), each once."""
        last = None
        for wall in heapq.merge(*(self._walls_of(t, start) for t in self.triggers)):
            if wall != last:
                yield wall
                last = wall

    @staticmethod
    def _walls_of(trigger: CronTrigger, start: dt.datetime) -> Iterator[dt.datetime]:
        wall = trigger.get_next_fire_time(None, start)
        while wall is not None:
            yield wall
            wall = trigger.get_next_fire_time(wall, wall + dt.timedelta(microseconds=1))

    def fires(self, after_ms: int) -> Iterator[int]:
        """Fire times strictly after after_ms, epoch ms, increasing (endless for most crons:
        the caller stops), ending where times leave year 9999 (none can be written after)."""
        try:
            yield from self._fires(after_ms)
        # datetime's range ends at year 9999 in any zone (OverflowError, ValueError), and so
        # does the trigger's year field (IndexError: no field left to carry into)
        except (OverflowError, ValueError, IndexError):
            return

    def _fires(self, after_ms: int) -> Iterator[int]:
        moment = from_ms(after_ms)
        reading = moment.astimezone(self.zone).replace(tzinfo=UTC)
        # only near a change of the zone's offset can a wall time before the reading resolve
        # to an instant after it (a gap moves times forward)
        try:
            near_change = (moment - REWIND).astimezone(self.zone).utcoffset() != (
                moment + REWIND).astimezone(self.zone).utcoffset()
        except OverflowError:  # hours from the end of year 9999: no zone changes there
            near_change = False
        last = after_ms
        for wall in self._walls(reading - REWIND if near_change else reading):
            instant = resolve_wall_time(wall.replace(tzinfo=None), self.zone)
            if instant > MAX_MS:
                return
            if instant > last:
                yield instant
                last = instant

    def next_after(self, after_ms: int) -> int | None:
        return next(self.fires(after_ms), None)
