"""Parsing and formatting of API times. Times are epoch milliseconds inside duetime.

Inputs: RFC 3339 with an offset, integer epoch milliseconds, or a wall-clock local time with
an IANA zone. Wall times that do not exist (DST gap) move forward by the gap's length (02:30 in
a 02:00→03:00 spring-forward becomes 03:30); wall times that exist twice (DST fold) take the
first occurrence (the earlier instant). This matches cron and EventBridge Scheduler.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = dt.UTC


class TimeFormatError(ValueError):
    """A time could not be understood; the message says what was expected."""


def parse_instant(value: object) -> int:
    """RFC 3339 with offset, or integer epoch ms → epoch ms."""
    if isinstance(value, bool):
        raise TimeFormatError("expected an RFC 3339 time with offset or epoch milliseconds")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise TimeFormatError("expected an RFC 3339 time with offset or epoch milliseconds")
    try:
        parsed = dt.datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError as exc:
        raise TimeFormatError(f"not an RFC 3339 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise TimeFormatError("RFC 3339 time needs an offset (Z or +hh:mm)")
    return to_ms(parsed)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MS = dt.timedelta(milliseconds=1)


def to_ms(moment: dt.datetime) -> int:
    """An aware datetime → epoch ms (floored)."""
    return (moment - _EPOCH) // _MS


def from_ms(epoch_ms: int) -> dt.datetime:
    """Epoch ms → an aware UTC datetime. (Timestamps go to the driver as epoch ms ints: it
    writes an int as the timestamp's milliseconds, with no datetime made.)"""
    return _EPOCH + epoch_ms * _MS


def cql_ms(value: dt.datetime) -> int:
    """A timestamp as the driver returns it (naive, UTC) → epoch ms."""
    return (value - _EPOCH_NAIVE) // _MS if value.tzinfo is None else to_ms(value)


def format_ms(epoch_ms: int) -> str:
    """Epoch ms → RFC 3339 UTC with millisecond precision, e.g. 2026-12-01T09:00:00.250Z."""
    return (_EPOCH_NAIVE + epoch_ms * _MS).isoformat(timespec="milliseconds") + "Z"


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TimeFormatError(f"unknown IANA time zone: {name!r}") from exc


def resolve_wall_time(wall: dt.datetime, tz: ZoneInfo) -> int:
    """A naive wall-clock time in tz → epoch ms, with the gap/fold rules of this module.

    PEP 495's fold=0 gives both: in a fold the first occurrence, in a gap the offset from
    before the transition, which lands the gap's length later on the wall clock."""
    return to_ms(wall.replace(tzinfo=tz, fold=0))


def parse_local_time(local_time: str, timezone: str) -> int:
    """"2026-12-01T09:00:00" in an IANA zone → epoch ms."""
    try:
        wall = dt.datetime.fromisoformat(local_time)
    except ValueError as exc:
        raise TimeFormatError(f"not a local time: {local_time!r}") from exc
    if wall.tzinfo is not None:
        raise TimeFormatError("local_time must not carry an offset; the timezone gives it")
    return resolve_wall_time(wall, zone(timezone))
