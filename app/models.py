"""Domain records shared by the API, the releasers and the Spark jobs. Times are epoch ms."""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from typing import Any

STATES = ("scheduled", "paused", "leased", "delivered", "cancelled", "dead")


@dataclasses.dataclass(frozen=True)
class TopicSettings:
    """What a producer may set on a topic (openapi.yaml, topics). Durations in seconds."""

    lease_seconds: int = 30
    max_attempts: int = 10
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 600.0
    shards: int = 16
    delivery_mode: str = "pull"
    delivery_url: str | None = None
    delivery_timeout_seconds: float = 10.0
    quiet_start: str | None = None  # quiet hours "HH:MM" to "HH:MM" in quiet_timezone
    quiet_end: str | None = None
    quiet_timezone: str | None = None
    # the send window's stored form (app.core.send_window.SendWindow.text); set instead of
    # quiet hours, never with them
    send_window: str | None = None
    # IANA zone of the messages that name none (app.messages.zones.effective_zone); None: UTC
    timezone: str | None = None
    # the frequency cap's stored form (app.core.frequency_cap.FrequencyCap.text); None: none
    frequency_cap: str | None = None


@dataclasses.dataclass(frozen=True)
class Topic:
    """A tenant's timeline. uid names this incarnation: a re-created topic gets a new one."""

    tenant: str
    name: str
    uid: uuid.UUID
    settings: TopicSettings
    signing_secret: str
    created_at_ms: int
    updated_at_ms: int
    # the secret a rotation replaced, which signs too until previous_secret_until_ms
    previous_secret: str | None = None
    previous_secret_until_ms: int | None = None

    def signing_secrets(self, now_ms: int) -> list[str]:
        """The secrets that sign a POST made at now_ms: the current one first."""
        if self.previous_secret and (self.previous_secret_until_ms or 0) > now_ms:
            return [self.signing_secret, self.previous_secret]
        return [self.signing_secret]

    @property
    def pushed(self) -> bool:
        """Releasers deliver its messages (webhook mode), rather than consumers leasing."""
        return self.settings.delivery_mode == "webhook"


@dataclasses.dataclass(frozen=True)
class MessageState:
    """The one row that is the truth of a message (table message_states, in its home)."""

    topic_uid: uuid.UUID
    id: str
    state: str
    version: int
    due_at_ms: int
    deliver_at_ms: int
    priority: int
    campaign: str | None
    shard: int
    attempts: int
    content_hash: str
    lease_token: uuid.UUID | None
    lease_expires_at_ms: int | None
    consumer: str | None
    last_error: str | None
    created_at_ms: int
    updated_at_ms: int
    last_op: uuid.UUID | None = None  # the campaign operation that last changed it
    paced: bool = False  # moved to its delivery slot by its campaign's pacing
    group: str | None = None  # fair-delivery group (app.core.timeline.lane_of)
    # send windows (app.messages.send_windows): the message's own window (stored form, or
    # "false": exempt; None: the topic's), and the deliver_at it asked for when its window
    # moved it
    send_window: str | None = None
    requested_at_ms: int | None = None
    recipient: str | None = None  # who it is for (the API's id pattern)
    # key -> value, at most 10 (app.messages.labels); left out of hash(): a dict has none
    labels: dict[str, str] | None = dataclasses.field(default=None, hash=False)
    timezone: str | None = None  # its recipient's IANA zone, when it names one
    # frequency caps (app.delivery.frequency_caps): True when the message is exempt (None:
    # counted), and why it was cancelled when a cap dropped it
    cap_exempt: bool | None = None
    cancel_reason: str | None = None

    @property
    def fair_group(self) -> str | None:
        """The group it takes turns in (app.delivery.fairness): its `group`, else its campaign."""
        return self.group or self.campaign


@dataclasses.dataclass(frozen=True)
class Payload:
    """A message's immutable body: JSON text or raw bytes (encoding 'json' or 'base64')."""

    data: bytes
    encoding: str
    headers: dict[str, str]

    def as_api_value(self) -> Any:
        if self.encoding == "json":
            return json.loads(self.data)
        return base64.b64encode(self.data).decode("ascii")


@dataclasses.dataclass(frozen=True)
class Pointer:
    """One timeline entry: message `id` at version `version` is due at due_at_ms."""

    due_at_ms: int
    id: str
    version: int
    priority: int
    shard: int
    lane: int = 0  # fair-delivery lane (app.core.timeline.lane_of)


@dataclasses.dataclass(frozen=True)
class MessageFilter:
    """Which messages of a topic a search (or a filtered operation) means: every field
    optional, all of them ANDed; `labels` are (key, value) pairs, each required. Times are
    epoch ms: due_from_ms <= deliver_at < due_to_ms."""

    state: str | None = None
    campaign: str | None = None
    recipient: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    due_from_ms: int | None = None
    due_to_ms: int | None = None

    def matches(self, row: MessageState) -> bool:
        """Whether the row, as read, is one the filter means."""
        own = row.labels or {}
        return ((self.state is None or row.state == self.state)
                and (self.campaign is None or row.campaign == self.campaign)
                and (self.recipient is None or row.recipient == self.recipient)
                and all(own.get(k) == v for k, v in self.labels)
                and (self.due_from_ms is None or row.deliver_at_ms >= self.due_from_ms)
                and (self.due_to_ms is None or row.deliver_at_ms < self.due_to_ms))
