"""Parsing and formatting of API times. Times are epoch milliseconds inside duetime.

Inputs: RFC 3339 with an offset, integer epoch milliseconds, or a wall-clock local time with
an IANA zone. Wall times that do not exist (DST gap) move forward by the gap's length (02:30 in
a 02:00→03:00 spring-forward becomes 03:30); wall times that exist twice (DST fold) take the
first occurrence (the earlier instant). This matches cron and EventBridge Scheduler.
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = dt.UTC


class TimeFormatError(ValueError):
    """A time could not be understood; the message says what was expected."""


# RFC 3339's date-time (section 5.6), with its "T" and its offset; fromisoformat alone also
# takes ISO 8601's other spellings (week dates, the basic format, a space for the T)
_RFC_3339_ANY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
                           r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})", re.ASCII)
# On 0001-01-01 a time ahead of UTC, and on 9999-12-31 one behind it, may be an instant
# outside years 1 to 9999: there a time is written in UTC. The pattern says so, so that the
# schema (app.schemas.fields.Instant) states the bound an offset would otherwise hide.
_EDGE_DAYS = (r"(?!0001-01-01[Tt][0-9:.]+\+(?!00:00))"
              r"(?!9999-12-31[Tt][0-9:.]+-(?!00:00))")
RFC_3339 = re.compile(_EDGE_DAYS + _RFC_3339_ANY.pattern, re.ASCII)
# the instants a datetime holds: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z, epoch ms
MIN_MS = -62_135_596_800_000
MAX_MS = 253_402_300_799_999


def parse_instant(value: object) -> int:
    """RFC 3339 with offset, or integer epoch ms → epoch ms; years 1 to 9999."""
    if isinstance(value, bool):
        raise TimeFormatError("expected an RFC 3339 time with offset or epoch milliseconds")
    if isinstance(value, int):
        epoch_ms = value
    elif not isinstance(value, str):
        raise TimeFormatError("expected an RFC 3339 time with offset or epoch milliseconds")
    elif not RFC_3339.fullmatch(value):
        if _RFC_3339_ANY.fullmatch(value):
            raise TimeFormatError("on 0001-01-01 a time ahead of UTC, and on 9999-12-31 one "
                                  f"behind it, is written in UTC (Z): {value[:64]!r}")
        raise TimeFormatError(f"not an RFC 3339 time with offset "
                              f"(e.g. 2026-12-01T09:00:00.250Z): {value[:64]!r}")
    else:
        try:
            epoch_ms = to_ms(dt.datetime.fromisoformat(value.upper()))
        except ValueError as exc:
            raise TimeFormatError(f"not an RFC 3339 time: {value[:64]!r}") from exc
    if not MIN_MS <= epoch_ms <= MAX_MS:
        raise TimeFormatError("outside years 1 to 9999 UTC (epoch milliseconds "
                              f"{MIN_MS} to {MAX_MS})")
    return epoch_ms


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


# a wall time: RFC 3339's date-time without its offset, of a day that exists, in years 2 to
# 9998 (so that in every zone, at most 14 h from UTC, it is an instant of years 1 to 9999);
# spelled out as a pattern so that openapi.yaml states exactly what is taken
_YEAR = r"([1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8]|0[1-9][0-9]{2}|00[1-9][0-9]|000[2-9])"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"({_YEAR}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)"
         rf"|(0[13578]|1[02])-31)|{_LEAP_YEAR}-02-29)")
LOCAL_TIME = re.compile(rf"{_DATE}[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?",
                        re.ASCII)


def parse_local_time(local_time: str, timezone: str) -> int:
    """"2026-12-01T09:00:00" in an IANA zone → epoch ms; an instant of years 1 to 9999 UTC."""
    if RFC_3339.fullmatch(local_time):
        raise TimeFormatError("local_time must not carry an offset; the timezone gives it")
    if not LOCAL_TIME.fullmatch(local_time):
        if local_time.startswith(("0001-", "9999-")):
            raise TimeFormatError("a local_time is of years 2 to 9998 (so that in every zone "
                                  f"it is an instant of years 1 to 9999): {local_time[:64]!r}")
        raise TimeFormatError(f"not a local time (e.g. 2026-12-01T09:00:00, no offset): "
                              f"{local_time[:64]!r}")
    tz = zone(timezone)
    try:
        wall = dt.datetime.fromisoformat(local_time.upper())
    except ValueError as exc:  # a day or an hour that does not exist
        raise TimeFormatError(f"not a local time: {local_time[:64]!r}") from exc
    epoch_ms = resolve_wall_time(wall, tz)
    if not MIN_MS <= epoch_ms <= MAX_MS:
        raise TimeFormatError("outside years 1 to 9999 UTC in that zone")
    return epoch_ms
