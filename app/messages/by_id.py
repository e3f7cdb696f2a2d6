"""Message use cases besides enqueue and leasing: read, cancel, reschedule."""

from __future__ import annotations

import dataclasses

from app.core.timeline import parked_ms
from app.errors import Conflict, NotFound, StoreUnavailable
from app.messages.lifetimes import keep_alive
from app.messages.send_windows import place_row
from app.messages.transitions import apply_transition, count_moves
from app.models import MessageState, Payload, Topic
from app.services import Services

FINAL_FOR_CANCEL = {"delivered": "already delivered", "dead": "dead"}
MOVABLE = ("scheduled", "paused")  # what PATCH and a replace may change
RELEASER_PREFIX = "releaser:"


def get_message(services: Services, topic: Topic,
                message_id: str) -> tuple[MessageState, Payload | None]:
    row = services.messages.get(topic.uid, message_id)
    if row is None:
        raise NotFound(f"No message {message_id!r}.")
    payloads = services.messages.get_payloads(topic.uid, [(row.id, row.content_hash)])
    return row, payloads.get((row.id, row.content_hash))


def being_delivered(row: MessageState) -> bool:
    """Is a releaser POSTing this message? A webhook message is leased only once it is due
    and its POST starts, and stays so until the POST's outcome is written (which the
    releaser keeps trying): cancelling it can no longer stop that POST. Decided by the row
    alone, never by comparing this host's clock with another's."""
    return row.state == "leased" and (row.consumer or "").startswith(RELEASER_PREFIX)


def cancel(services: Services, topic: Topic, message_id: str) -> None:
    """Cancel a scheduled, paused or leased message: it is never delivered (a consumer
    holding a lease gets 409 on ack). Cancelling a cancelled message again is a no-op; a
    delivered or dead one, or one whose POST has started (being_delivered), answers 409.
    The race with a take is decided by the row's conditional write: whichever applies first
    wins."""
    for _ in range(3):
        row = services.messages.get(topic.uid, message_id)
        if row is None:
            raise NotFound(f"No message {message_id!r}.")
        if row.state == "cancelled":
            return
        if row.state in FINAL_FOR_CANCEL:
            raise Conflict(f"Message {message_id!r} is {FINAL_FOR_CANCEL[row.state]}.")
        now = services.clock()
        if being_delivered(row):
            raise Conflict(f"Message {message_id!r} is being delivered.")
        gone = dataclasses.replace(row, state="cancelled", version=row.version + 1,
                                   lease_token=None, lease_expires_at_ms=None, updated_at_ms=now)
        try:
            apply_transition(services, topic, gone, moved=False, before=row)
        except Conflict:
            continue  # it moved under us (leased, acked): decide again from the new row
        count_moves(services, topic, [(row.state, "cancelled", row.campaign)])
        if row.state == "scheduled":
            services.counts.add_upcoming(topic.uid, [row.due_at_ms], sign=-1)
        return
    raise Conflict(f"Message {message_id!r} is changing concurrently; retry.")


def reschedule(services: Services, topic: Topic, message_id: str,
               deliver_at_ms: int) -> MessageState:
    """Move a scheduled message to deliver_at_ms (its pointer first, then the LWT), or to its
    send window's next opening when that time is outside it (app.messages.send_windows);
    beyond the horizon it is parked there (app.core.timeline.parked_ms). A paused one moves
    too and stays paused (no pointer: none hands it out until resumed). A row that will wait
    long has its payload kept alive first (app.messages.lifetimes). A row changed meanwhile
    by anything but a hand-out (a hop, a step of an operation) is read and moved again; 409
    unless it is scheduled or paused."""
    for _ in range(3):
        now = services.clock()
        row = services.messages.get(topic.uid, message_id)
        if row is None:
            raise NotFound(f"No message {message_id!r}.")
        if row.state not in MOVABLE:
            raise Conflict(f"Message {message_id!r} is {row.state}; only scheduled or paused "
                           "ones move.")
        placed = place_row(topic, row, deliver_at_ms, now)
        moved = dataclasses.replace(row, version=row.version + 1,
                                    due_at_ms=parked_ms(placed.deliver_at_ms, now,
                                                        services.config.horizon_days),
                                    deliver_at_ms=placed.deliver_at_ms,
                                    requested_at_ms=placed.requested_ms, updated_at_ms=now,
                                    paced=False)  # a pace's slot was for the old time
        if keep_alive(services, topic, [moved], now):
            raise StoreUnavailable("Could not write the message's payload again; retry.")
        waiting = row.state == "scheduled"
        try:
            apply_transition(services, topic, moved, moved=waiting, before=row)
        except Conflict:
            continue  # it changed under us: decide again from the new row
        if waiting:
            services.counts.add_upcoming(topic.uid, [row.due_at_ms], sign=-1)
            services.counts.add_upcoming(topic.uid, [moved.due_at_ms])
        return moved
    raise Conflict(f"Message {message_id!r} is changing concurrently; retry.")
