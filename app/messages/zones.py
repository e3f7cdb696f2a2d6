"""A message's time zone: the one its recipient's wall clock is read in (send windows,
frequency caps per local day, local times). Pure."""

from __future__ import annotations

from app.models import MessageState, TopicSettings

DEFAULT_ZONE = "UTC"


def effective_zone(settings: TopicSettings, timezone: str | None) -> str:
    """The IANA zone of a message of a topic with these settings: its own `timezone` when it
    names one, else the topic's `timezone`, else UTC. Both were checked against tzdata when
    they were written."""
    return timezone or settings.timezone or DEFAULT_ZONE


def zone_of(settings: TopicSettings, row: MessageState) -> str:
    """effective_zone() of a written message, from its row."""
    return effective_zone(settings, row.timezone)
