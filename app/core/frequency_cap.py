"""Frequency caps: how many messages one recipient may be handed per local day or rolling
window, and when a hand-out stops counting. Pure: no I/O; every time is epoch ms.

A cap `max` per `day` counts the hand-outs of the recipient's local calendar day: one made
at `now` counts until the next local midnight (window_end()). A cap per `hours` counts each
hand-out for that many hours after it. Midnight is a wall time like any other in duetime
(app.core.timeparse.resolve_wall_time): in a DST gap it moves forward by the gap's length
(the day then starts at the first instant that exists), and where it occurs twice (a fold)
the day ends at the first occurrence unless that is already past.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from zoneinfo import ZoneInfo

from app.core.timeparse import from_ms, resolve_wall_time, to_ms

PERS = ("day", "hours")
ON_CAP = ("defer", "drop")
MAX_PER_WINDOW = 100  # slots of one recipient: one partition of at most this many rows
MAX_HOURS = 24 * 31
_TEXT = re.compile(r"^([0-9]+)/(day|([0-9]+)h)/(defer|drop)$")
MS_PER_HOUR = 3_600_000
DEFERRED, DROPPED = "cap_deferred", "cap_dropped"  # counter rows beside the states'


def capped_counts(counts: dict[str, int]) -> dict[str, int]:
    """{deferred, dropped} out of a topic's or a campaign's counter rows ({row: n})."""
    return {"deferred": max(0, counts.get(DEFERRED, 0)),
            "dropped": max(0, counts.get(DROPPED, 0))}


class CapError(ValueError):
    """A cap that cannot be: `field` names the part that is wrong (max, per, hours)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class FrequencyCap:
    """At most `max` hand-outs per recipient per local day (`hours` None) or per rolling
    `hours`; `on_cap` says what happens to a message past it: defer or drop."""

    max: int
    hours: int | None
    on_cap: str

    @classmethod
    def parse(cls, max_: int, per: str, hours: int | None, on_cap: str) -> FrequencyCap:
        """The cap as an API request gives it; CapError naming the field at fault."""
        if not 1 <= max_ <= MAX_PER_WINDOW:
            raise CapError("max", f"Must be between 1 and {MAX_PER_WINDOW}.")
        if per not in PERS:
            raise CapError("per", f"Must be one of {', '.join(PERS)}.")
        if on_cap not in ON_CAP:
            raise CapError("on_cap", f"Must be one of {', '.join(ON_CAP)}.")
        if per == "day":
            if hours is not None:
                raise CapError("hours", "Only with per: hours.")
            return cls(max_, None, on_cap)
        if hours is None or not 1 <= hours <= MAX_HOURS:
            raise CapError("hours", f"per: hours needs hours between 1 and {MAX_HOURS}.")
        return cls(max_, hours, on_cap)

    def api(self) -> dict[str, object]:
        """The cap as the API shows it."""
        shown: dict[str, object] = {"max": self.max, "per": "hours" if self.hours else "day",
                                    "on_cap": self.on_cap}
        if self.hours:
            shown["hours"] = self.hours
        return shown

    def text(self) -> str:
        """The stored form: "2/day/defer", "3/6h/drop"."""
        per = f"{self.hours}h" if self.hours else "day"
        return f"{self.max}/{per}/{self.on_cap}"

    @classmethod
    def from_text(cls, text: str) -> FrequencyCap:
        found = _TEXT.match(text)
        if found is None:
            raise CapError("frequency_cap", f"not a stored cap: {text!r}")
        return cls(int(found.group(1)), int(found.group(3)) if found.group(3) else None,
                   found.group(4))

    def window_end(self, tz: ZoneInfo, now_ms: int) -> int:
        """Until when (epoch ms, exclusive) a hand-out made at now_ms counts: the next local
        midnight in tz after now_ms, or now_ms + hours. Always after now_ms."""
        if self.hours:
            return now_ms + self.hours * MS_PER_HOUR
        return next_midnight(tz, now_ms)


def next_midnight(tz: ZoneInfo, now_ms: int) -> int:
    """The first instant after now_ms at which tz's calendar date is a later one than at
    now_ms: the next local midnight (a midnight in a DST gap: the first instant after it;
    one in a fold: its first occurrence, or its second when the first has passed)."""
    today = from_ms(now_ms).astimezone(tz).date()
    for ahead in (1, 2):
        wall = dt.datetime.combine(today + dt.timedelta(days=ahead), dt.time())
        for fold in (0, 1):
            moment = (resolve_wall_time(wall, tz) if fold == 0
                      else to_ms(wall.replace(tzinfo=tz, fold=1)))
            if moment > now_ms:
                return moment
    raise AssertionError("unreachable: a local day never lasts two days")
