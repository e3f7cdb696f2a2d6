"""What a filtered operation (cancel, shift, pause or resume) does to each message of a page.

As a campaign operation's steps (app.campaigns.operations): each change is an LWT over the
version read, marked last_op = the operation's id; a row already marked is counted as
changed and left alone, so a page applied again (by a runner that took over) changes no
message twice and its counts are exact. A row that no longer matches the filter when it is
read is left alone and not counted as changed.

- cancel: a message waiting to be handed out (scheduled or paused, or leased with its lease
  run out, waiting for its retry) becomes cancelled. One handed out and not finished (leased
  to a pull consumer whose lease runs, or whose POST has started: app.messages.by_id.
  being_delivered) is counted as delivering and left to its consumer: its ack delivers it,
  its nack puts it back, uncancelled. Every hand-out is an LWT over the row's version, which
  the cancel changed, so no message this operation counted as changed is handed out after.
- shift: a scheduled or paused message moves by shift_ms from the time it asked for, never
  to before now, then its send window places it (app.messages.send_windows); a paused one
  stays paused; beyond the horizon it is parked. One the shift would move past the end of
  year 9999 stays where it is (looked at, not changed). The campaigns of moved messages
  widen their bounds to cover them (bounds may end wider than the messages).
- pause: a message waiting to be handed out becomes paused, at its due time: no pointer
  hands a paused row out. One handed out and not finished is counted as delivering and left
  to its consumer, as for cancel.
- resume: a paused message is scheduled again at its due time, or now if that has passed
  (inside its send window: its next opening when now is outside), pointer first; a paced
  campaign's message whose slot passed meanwhile gets a new one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from app.campaigns import manage as campaigns
from app.campaigns import operations as campaign_ops
from app.campaigns.operations import Progress
from app.errors import StoreUnavailable
from app.messages.by_id import being_delivered
from app.messages.send_windows import retry_due
from app.models import MessageFilter, MessageState, Topic
from app.services import Services
from app.store.operations import Operation


def _decide(topic: Topic, op: Operation, flt: MessageFilter, row: MessageState, now: int,
            horizon_days: int, progress: Progress) -> MessageState | None:
    """The row this operation makes of `row` (None: leave it), counting what it finds."""
    if row.last_op == op.id:
        progress.changed += 1
        return None
    if not flt.matches(row):
        return None
    if op.kind in ("cancel", "pause"):
        if being_delivered(row) or (
                row.state == "leased" and (row.lease_expires_at_ms or 0) > now):
            progress.delivering += 1
            return None
        if op.kind == "cancel" and row.state in ("scheduled", "paused", "leased"):
            return campaign_ops.cancelled(op, row, now)
        if op.kind == "pause" and row.state in ("scheduled", "leased"):
            return paused(op, row, now)
        return None
    if op.kind == "resume":
        return resumed(topic, op, row, now) if row.state == "paused" else None
    asked = campaign_ops.shift_asked(row, op.shift_ms)
    return None if asked is None else campaign_ops.shifted(topic, op, row, asked, now,
                                                            horizon_days)


def paused(op: Operation, row: MessageState, now: int) -> MessageState:
    """The row held back by a pause, at its due time (a lease run out, its retry's time is
    its due time already), its lease cleared."""
    return dataclasses.replace(row, state="paused", version=row.version + 1, lease_token=None,
                               lease_expires_at_ms=None, updated_at_ms=now, last_op=op.id)


def resumed(topic: Topic, op: Operation, row: MessageState, now: int) -> MessageState:
    """A paused row scheduled again at its due time, or now (epoch ms) if that has passed,
    inside its send window (its next opening when now is outside); deliver_at unchanged. A
    paced campaign's message whose delivery slot passed while it was paused, or that its
    send window moves, is paced again (a new slot), so that resuming never releases its
    campaign faster than its rate."""
    due = retry_due(topic, row, max(row.due_at_ms, now))  # never behind now: a pointer's place
    return dataclasses.replace(row, state="scheduled", version=row.version + 1, due_at_ms=due,
                               updated_at_ms=now, last_op=op.id,
                               paced=row.paced and due == row.due_at_ms)


def apply(services: Services, topic: Topic, op: Operation, flt: MessageFilter,
          rows: Sequence[MessageState]) -> Progress:
    """Apply op to `rows` (one page, as read by the search or by id). Rows that changed
    under a step are read and decided again; raises StoreUnavailable if some still could not
    be settled, so the page is applied again later."""
    progress = Progress()
    pending = list(rows)
    moved: list[MessageState] = [r for r in rows if r.last_op == op.id]
    for _ in range(campaign_ops.ROUNDS):
        now = services.clock()
        changes = [(row, new) for row in pending
                   if (new := _decide(topic, op, flt, row, now, services.config.horizon_days,
                                      progress)) is not None]
        lost = {row.id for row, _ in campaign_ops.write(services, topic, changes, now,
                                                        progress)}
        moved += [new for row, new in changes if row.id not in lost]
        if not lost:
            if op.kind == "shift":
                campaigns.widen_to_cover(services, topic, moved)
            return progress
        pending = list(services.messages.get_many(topic.uid, sorted(lost)).values())
    raise StoreUnavailable(f"messages of operation {op.id} kept changing")
