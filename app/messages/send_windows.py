"""Which send window applies to a message, and where it puts a due time: the one placement every
path that sets a due time goes through (enqueue and batch, the Spark import, a schedule's
fire, PATCH, a campaign shift, a nack, a failed webhook POST, and a frequency cap's deferral).
Pure: no I/O; times are epoch ms.

The window: the message's own `send_window`, else the topic's (`send_window`, or its
`quiet_hours` spelling: quiet 21:00-08:00 is the window 08:00-21:00 every day); none for a
message that says `send_window: false` or `quiet_hours: false`. It is read on the wall clock
of the message's zone (message_zone()). A due time outside it goes to the window's next
opening (app.core.send_window); one inside stays. Never earlier: a placement only ever moves
a time later.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from zoneinfo import ZoneInfo

from app.core.send_window import SendWindow, minute_of
from app.core.timeparse import zone
from app.messages.zones import effective_zone
from app.models import MessageState, Topic, TopicSettings

# a message row's send_window when the message opted out (send_window or quiet_hours false)
EXEMPT = "false"


@dataclasses.dataclass(frozen=True)
class Rule:
    """The window one message's due times are kept in, and the zone it is read in."""

    window: SendWindow
    tz: ZoneInfo


@dataclasses.dataclass(frozen=True)
class Placed:
    """Where a time asked for goes: deliver_at_ms, and the time asked for when the window
    moved it (None when it did not)."""

    deliver_at_ms: int
    requested_ms: int | None


@functools.lru_cache(maxsize=1024)
def stored_window(text: str) -> SendWindow:
    """A window in its stored form (SendWindow.text()), parsed once per process."""
    return SendWindow.from_text(text)


def quiet_hours_window(start: str, end: str) -> SendWindow:
    """Quiet hours [start, end) every day, as the send window they leave open: [end, start)
    every day (start == end: no quiet hours, open all day). WindowError naming the field."""
    return SendWindow.every_day(minute_of("end", end), minute_of("start", start))


def topic_window(settings: TopicSettings) -> tuple[SendWindow | None, str | None]:
    """The topic's window, and the zone it names for messages without one (only the quiet
    hours spelling has a zone of its own)."""
    if settings.send_window is not None:
        return stored_window(settings.send_window), None
    if settings.quiet_start is not None and settings.quiet_end is not None:
        return quiet_hours_window(settings.quiet_start, settings.quiet_end), settings.quiet_timezone
    return None, None


def own_window(data: dict[str, Any]) -> str | None:
    """A message's own choice as its row stores it, from the validated request: its window's
    stored form, EXEMPT, or None (the topic's window applies)."""
    if data.get("send_window") is False or data.get("quiet_hours") is False:
        return EXEMPT
    given = data.get("send_window")
    if isinstance(given, dict):
        return SendWindow.parse(given["days"], given["start"], given["end"]).text()
    return None


def message_zone(topic: Topic, timezone: str | None, window_zone: str | None = None) -> str:
    """The zone a message's window is read in: its own `timezone`, else the zone its quiet
    hours name (the quiet_hours spelling), else the topic's default `timezone`, else UTC
    (app.messages.zones.effective_zone)."""
    return effective_zone(topic.settings, timezone or window_zone)


def rule(topic: Topic, own: str | None, timezone: str | None) -> Rule | None:
    """The rule for a message of topic with this own choice (own_window()) and timezone;
    None when no window applies."""
    if own == EXEMPT:
        return None
    window, window_zone = topic_window(topic.settings)
    if own is not None:
        window, window_zone = stored_window(own), None
    if window is None:
        return None
    return Rule(window, zone(message_zone(topic, timezone, window_zone)))


def rule_of_row(topic: Topic, row: MessageState) -> Rule | None:
    """The rule for a message already written, from its row (its own window and zone)."""
    return rule(topic, row.send_window, row.timezone)


def place(found: Rule | None, asked_ms: int, now_ms: int) -> Placed:
    """Where a message asked for at asked_ms, set at now_ms, is due: the window is applied to
    the moment it would be due (never before now), and deliver_at moves only when that
    moment is outside it; a time in the past inside the window keeps its deliver_at and is
    due now, as without a window."""
    if found is None:
        return Placed(asked_ms, None)
    due = max(asked_ms, now_ms)
    opened = found.window.place(due, found.tz)
    return Placed(asked_ms, None) if opened == due else Placed(opened, asked_ms)


def place_row(topic: Topic, row: MessageState, asked_ms: int, now_ms: int) -> Placed:
    """place() for a written message moved to asked_ms (PATCH, a campaign shift, a deferral)."""
    return place(rule_of_row(topic, row), asked_ms, now_ms)


def retry_due(topic: Topic, row: MessageState, due_ms: int) -> int:
    """When a written message's next attempt is due, for an attempt due at due_ms (a nack's
    delay or a retry's backoff): due_ms inside its window, else the next opening. Its
    deliver_at (the time it was asked for) does not change."""
    found = rule_of_row(topic, row)
    return due_ms if found is None else found.window.place(due_ms, found.tz)

