"""Dead messages: recorded as they die, listed newest first, retried on demand (a
dead-letter queue's redrive).

Recording comes before the LWT that makes a message dead (like a pointer before its move),
so a message can be dead only once its row in dead_letters exists; the list checks each
message's state, so rows whose LWT lost or whose message was retried are not shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from app.errors import Conflict
from app.messages.by_id import get_message
from app.messages.transitions import apply_transition, count_moves
from app.models import MessageState, Payload, Topic
from app.services import Services

LIST_READ_CHUNK = 100  # dead_letters rows whose messages are read at once


def record(services: Services, topic: Topic, rows: Sequence[MessageState]) -> set[str]:
    """Record the rows about to be made dead (others are ignored). Returns the ids whose
    record failed: their move to dead must not be tried now."""
    dead = [r for r in rows if r.state == "dead"]
    if not dead:
        return set()
    errors = services.dead_letters.note(topic.uid, [(r.id, r.updated_at_ms) for r in dead])
    return {r.id for r, err in zip(dead, errors, strict=True) if err is not None}


def newest_dead(services: Services, topic: Topic,
                limit: int) -> list[tuple[MessageState, Payload | None]]:
    """Up to `limit` messages of the topic that are dead now, most recently dead first,
    with their payloads, from the topic's retention window."""
    now = services.clock()
    weeks = services.config.retention_days // 7 + 2
    found: list[MessageState] = []
    seen: set[str] = set()
    candidates = services.dead_letters.newest(topic.uid, now, weeks)
    while len(found) < limit:
        chunk = []
        for message_id, _ in candidates:
            if message_id not in seen:
                seen.add(message_id)
                chunk.append(message_id)
                if len(chunk) == LIST_READ_CHUNK:
                    break
        if not chunk:
            break
        rows = services.messages.get_many(topic.uid, chunk)
        found.extend(rows[i] for i in chunk if i in rows and rows[i].state == "dead")
    found = found[:limit]
    payloads = services.messages.get_payloads(topic.uid, [(r.id, r.content_hash) for r in found])
    return [(r, payloads.get((r.id, r.content_hash))) for r in found]


def retry(services: Services, topic: Topic, message_id: str) -> MessageState:
    """Make a dead message scheduled again, due now, with its attempts counted from 0 (its
    last error kept until a new one). 409 unless it is dead."""
    row, payload = get_message(services, topic, message_id)
    if row.state != "dead":
        raise Conflict(f"Message {message_id!r} is {row.state}; only dead ones are retried.")
    if payload is None:
        raise Conflict(f"Message {message_id!r} is past its retention (its payload is gone).")
    now = services.clock()
    again = dataclasses.replace(row, state="scheduled", version=row.version + 1, due_at_ms=now,
                                attempts=0, lease_token=None, lease_expires_at_ms=None,
                                consumer=None, updated_at_ms=now)
    apply_transition(services, topic, again, moved=True, before=row)
    count_moves(services, topic, [("dead", "scheduled", row.campaign)])
    services.counts.add_upcoming(topic.uid, [now])
    return again
