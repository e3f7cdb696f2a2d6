"""Topic use cases: create or update, read, list, delete, stats."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from app.core.frequency_cap import capped_counts
from app.core.timeline import MS_PER_HOUR, MS_PER_MINUTE, schedule_slot_of
from app.delivery import signing
from app.delivery.webhook_targets import Network, parse_allow, url_refusal
from app.errors import Conflict, InvalidInput, NotFound
from app.models import STATES, Topic, TopicSettings
from app.services import Services
from app.store.counts import FLUSH_S
from app.store.lag import LagMinute

RETRIES_ON_RACE = 3


def get_topic(services: Services, tenant: str, name: str) -> Topic:
    """The tenant's topic; NotFound (404) also for another tenant's topic of that name."""
    topic = services.topics.get(tenant, name)
    if topic is None:
        raise NotFound(f"No topic {name!r}.")
    return topic


def get_topic_cached(services: Services, tenant: str, name: str) -> Topic:
    """get_topic for message, lease, campaign and schedule requests: from this process's
    topic cache (app.topics.cache), so another process's change to the topic applies here
    within about 100 ms, this process's at once."""
    topic = services.topic_cache.get(tenant, name)
    if topic is None:
        raise NotFound(f"No topic {name!r}.")
    return topic


def _validated(settings: TopicSettings, allow: tuple[Network, ...]) -> TopicSettings:
    if settings.delivery_mode == "webhook" and not settings.delivery_url:
        raise InvalidInput("A webhook topic needs delivery.url.",
                           {"delivery": {"url": ["Required for mode webhook."]}})
    refused = settings.delivery_url and url_refusal(settings.delivery_url, allow)
    if refused:
        raise InvalidInput("Webhooks may not reach that address.",
                           {"delivery": {"url": [f"Refused: {refused}."]}})
    return settings


def put_topic(services: Services, tenant: str, name: str,
              changes: dict[str, Any]) -> tuple[Topic, bool]:
    """Create the topic with defaults overlaid by changes, or update the fields given in
    changes (omitted fields keep their values). Returns (topic, created).

    Changing `shards` is refused with Conflict while the topic holds scheduled, paused or
    leased messages: their pointers live in the old shard layout."""
    allow = parse_allow(services.config.webhook_allow)
    for _ in range(RETRIES_ON_RACE):
        now = services.clock()
        current = services.topics.get(tenant, name)
        if current is None:
            settings = _validated(dataclasses.replace(TopicSettings(), **changes), allow)
            topic = Topic(tenant, name, uuid.uuid4(), settings, signing.new_secret(), now, now)
            if services.topics.create(topic):
                _changed(services, tenant, name)
                return topic, True
            continue
        settings = _validated(dataclasses.replace(current.settings, **changes), allow)
        if settings.shards != current.settings.shards and _live_messages(services, current):
            raise Conflict("Cannot change shards of a topic with scheduled, paused or leased "
                           "messages.")
        topic = dataclasses.replace(current, settings=settings, updated_at_ms=now)
        if services.topics.update(topic, current):
            _changed(services, tenant, name)
            return topic, False
    raise Conflict("The topic changed concurrently; retry.")


def rotate_signing_secret(services: Services, tenant: str, name: str,
                          overlap_s: int) -> Topic:
    """Give the topic a new signing secret. For overlap_s seconds the one it replaces signs
    every POST too (0: not at all), so receivers can move to the new one meanwhile; a secret
    that was still in its overlap stops signing at once."""
    for _ in range(RETRIES_ON_RACE):
        current = get_topic(services, tenant, name)
        now = services.clock()
        topic = dataclasses.replace(
            current, signing_secret=signing.new_secret(), updated_at_ms=now,
            previous_secret=current.signing_secret if overlap_s else None,
            previous_secret_until_ms=now + overlap_s * 1000 if overlap_s else None)
        if services.topics.rotate_secret(topic, current):
            _changed(services, tenant, name)
            return topic
    raise Conflict("The topic changed concurrently; retry.")


def _live_messages(services: Services, topic: Topic) -> int:
    """Scheduled, paused and leased messages of the topic (each keeps the shard it was
    placed on), counted once every process has written the moves it made before this call
    (each writes its own within counts.FLUSH_S)."""
    time.sleep(2 * FLUSH_S)
    counts = services.counts.states(topic.uid)
    return sum(counts.get(s, 0) for s in ("scheduled", "paused", "leased"))


def delete_topic(services: Services, tenant: str, name: str) -> None:
    """Remove the topic. Its messages are never delivered afterwards: every reader finds
    messages through the topic's uid, which no longer resolves; its schedules fire no more."""
    topic = get_topic(services, tenant, name)
    if not services.topics.delete(tenant, name, topic.uid):
        raise NotFound(f"No topic {name!r}.")
    _changed(services, tenant, name)
    schedules = services.schedules.all(topic.uid)
    for s in schedules:  # no releaser looks at them again
        services.schedules.unlist(schedule_slot_of(str(topic.uid), s.name,
                                                   services.config.release_slots),
                                  topic.uid, s.name)
    if schedules:
        services.waker.wake("schedules")


def _changed(services: Services, tenant: str, name: str) -> None:
    """After a topic's applied change: this process's cache forgets it, the releasers are
    told at once (they also follow topic_changes)."""
    services.topic_cache.forget(tenant, name)
    services.waker.wake("topics")


WINDOWS = {"minute": (MS_PER_MINUTE, 60), "hour": (MS_PER_HOUR, 168)}  # width, how many


def topic_stats(services: Services, topic: Topic, window: str = "minute") -> dict[str, Any]:
    """Counts per state, and scheduled messages per window ahead: per minute for the next
    hour, or per hour for the next 7 days (counters moved by every enqueue, cancel, move and
    import; no read of the timeline)."""
    counts = services.counts.states(topic.uid)
    width, how_many = WINDOWS[window]
    now = services.clock()
    start = now - now % width
    end = start + how_many * width
    if window == "minute":
        per_slot = services.counts.upcoming(topic.uid, start, end)
    else:
        per_slot = services.counts.upcoming_hours(topic.uid, start, end)
    upcoming = [
        {"from_": start + i * width, "to": start + (i + 1) * width,
         "count": max(0, per_slot.get(start // width + i, 0))}
        for i in range(how_many)
    ]
    return {"counts": {s: max(0, counts.get(s, 0)) for s in STATES},
            "frequency_capped": capped_counts(counts), "upcoming": upcoming}


def delivery_lag(services: Services, topic: Topic, minutes: int) -> list[dict[str, Any]]:
    """The topic's delivery lag per minute for the last `minutes` minutes (the current one
    last): how many messages were handed out in it, and the p50, p99 (upper edges of
    app.store.lag's buckets) and largest lag, in ms."""
    now = services.clock()
    last = now - now % MS_PER_MINUTE
    first = last - (minutes - 1) * MS_PER_MINUTE
    found = services.lag_minutes.read(topic.uid, first, last)
    view = []
    for start in range(first, last + 1, MS_PER_MINUTE):
        lags = found.get(start, LagMinute())
        view.append({"from_": start, "to": start + MS_PER_MINUTE, "count": lags.count,
                     "p50_ms": lags.percentile_ms(0.5), "p99_ms": lags.percentile_ms(0.99),
                     "max_ms": lags.max_ms if lags.count else None})
    return view
