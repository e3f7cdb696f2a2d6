"""What a campaign operation does to each message: cancel, shift or resume.

Each step is an LWT over the version read (rule 3); a row it changes carries last_op = the
operation's id, and a row already carrying it is counted as changed and left alone. So an
operation changes a message at most once however often a page is run again (a resumed run
repeats the page after its last checkpoint; an enqueue that raced the operation covers its
own messages), and nothing changes behind the counters' back.

- cancel: a scheduled or paused message, or one leased by a pull consumer (whose ack then
  answers 409), becomes cancelled. One whose POST has started
  (app.messages.by_id.being_delivered) cannot be stopped: it is counted as delivering, and
  should that POST fail, the next take cancels it (the campaign is marked cancelled before
  the operation starts). Nothing is leased ahead of its hand-out, so every message not
  handed out yet is reached.
- shift: a scheduled or paused message moves by shift_ms, never to before now (pointer
  first; a paused one stays paused): the time it asked for moves (deliver_at, or the time
  its send window moved it from), then the window places it again
  (app.messages.send_windows); beyond the horizon it is parked. One that would pass the
  end of year 9999 stays.
- resume: a waiting message due by now moves to now, where every reader finds it again:
  while its campaign was paused, passes left it behind their cursors. A paced campaign's
  message whose slot passed meanwhile is paced again from now (a new slot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from app.core.timeline import parked_ms
from app.core.timeparse import MAX_MS
from app.errors import StoreUnavailable
from app.messages.by_id import being_delivered
from app.messages.lifetimes import keep_alive, relist, row_ttl_s
from app.messages.send_windows import place_row
from app.messages.transitions import WAITING, count_moves, finished, place_then
from app.models import MessageState, Topic
from app.services import Services
from app.store.campaigns import Span
from app.store.operations import Operation

ROUNDS = 5  # rows that changed under a step are read and decided again, this many times


@dataclasses.dataclass
class Progress:
    """What one page came to: messages this operation changed (now or before), messages
    found being delivered, and the deliver_at span of the page's messages after it."""

    changed: int = 0
    delivering: int = 0
    span: Span | None = None

    def cover(self, deliver_at_ms: int) -> None:
        s = self.span
        self.span = (deliver_at_ms, deliver_at_ms) if s is None else (
            min(s[0], deliver_at_ms), max(s[1], deliver_at_ms))


def cancelled(op: Operation, row: MessageState, now: int) -> MessageState:
    return dataclasses.replace(row, state="cancelled", version=row.version + 1, lease_token=None,
                               lease_expires_at_ms=None, updated_at_ms=now, last_op=op.id)


def asked_ms(row: MessageState) -> int:
    """The time a message asked for: its deliver_at, or the time its send window moved it
    from."""
    return row.deliver_at_ms if row.requested_at_ms is None else row.requested_at_ms


def shift_asked(row: MessageState, shift_ms: int) -> int | None:
    """The time a shift by shift_ms makes the row ask for (epoch ms), or None when the shift
    leaves it: not scheduled or paused, or moved past the end of year 9999."""
    asked = asked_ms(row) + shift_ms
    return asked if row.state in ("scheduled", "paused") and asked <= MAX_MS else None


def shifted(topic: Topic, op: Operation, row: MessageState, asked: int, now: int,
            horizon_days: int) -> MessageState:
    """A scheduled (or paused) row moved to ask for `asked` (never before now), placed by its
    send window (parked at the horizon when beyond it), marked with the operation; a paused
    one stays paused. A paced campaign's message is paced again at its new time (its slot
    was for the old one)."""
    placed = place_row(topic, row, max(asked, now), now)
    return dataclasses.replace(row, version=row.version + 1, deliver_at_ms=placed.deliver_at_ms,
                               requested_at_ms=placed.requested_ms,
                               due_at_ms=parked_ms(placed.deliver_at_ms, now, horizon_days),
                               updated_at_ms=now, last_op=op.id, paced=False)


def _decide(topic: Topic, op: Operation, row: MessageState, now: int, progress: Progress,
            horizon_days: int) -> MessageState | None:
    """The row this operation makes of `row` (None: leave it), counting what it finds."""
    if row.last_op == op.id:
        progress.changed += 1
        progress.cover(row.deliver_at_ms)
        return None
    if op.kind == "cancel":
        if being_delivered(row):
            progress.delivering += 1
        elif row.state in ("scheduled", "paused", "leased"):
            return cancelled(op, row, now)
        return None
    if op.kind == "shift":
        asked = shift_asked(row, op.shift_ms)
        if asked is None:
            progress.cover(row.deliver_at_ms)
            return None
        return shifted(topic, op, row, asked, now, horizon_days)
    waiting = row.state == "scheduled" or (
        row.state == "leased" and (row.lease_expires_at_ms or 0) <= now)
    if not waiting or row.due_at_ms > now:
        return None
    # one whose delivery slot passed while its campaign was paused is paced again (the take
    # reserves a new slot), or resuming would release every such message at once
    return dataclasses.replace(row, state="scheduled", version=row.version + 1, due_at_ms=now,
                               lease_token=None, lease_expires_at_ms=None, updated_at_ms=now,
                               last_op=op.id, paced=False)


def apply(services: Services, topic: Topic, op: Operation, ids: Sequence[str]) -> Progress:
    """Apply op to the messages `ids` of its campaign (one page; missing ids are skipped: a
    message whose row is not written yet is covered by its enqueue). Rows that changed under
    a step are read and decided again; raises StoreUnavailable if some still could not be
    settled, so the page is run again later."""
    progress = Progress()
    pending = list(ids)
    for _ in range(ROUNDS):
        rows = services.messages.get_many(topic.uid, pending)
        now = services.clock()
        changes = [(row, new) for row in rows.values()
                   if row.campaign == op.campaign
                   and (new := _decide(topic, op, row, now, progress,
                                       services.config.horizon_days)) is not None]
        pending = [row.id for row, new in write(services, topic, changes, now, progress)]
        if not pending:
            return progress
    raise StoreUnavailable(f"{len(pending)} messages of campaign {op.campaign!r} kept changing")


def write(services: Services, topic: Topic, changes: list[tuple[MessageState, MessageState]],
           now: int, progress: Progress) -> list[tuple[MessageState, MessageState]]:
    """Apply the changes (payloads and index entries kept alive first for rows that will wait
    long, app.messages.lifetimes; then pointers: every row left waiting needs one at its new
    version, even at the same due time, or no pointer would name it); count what applied;
    return the changes that lost to another transition."""
    unkept = keep_alive(services, topic, [new for _, new in changes], now)
    unkept |= relist(services, topic, [(row, new) for row, new in changes
                                       if new.state in WAITING], now)
    changes = [(row, new) for row, new in changes if new.id not in unkept]
    moving = [new for _, new in changes if new.state in WAITING]
    placed = {r.id for r in place_then(services, topic, moving, now)} if moving else set()
    todo = [(row, new) for row, new in changes if new.state not in WAITING or new.id in placed]
    outcomes = services.messages.cas_many(
        [(new, row.version, row_ttl_s(new, now, services.config)) for row, new in todo],
        before={row.id: row for row, _ in todo})
    done = [(row, new) for (row, new), ok in zip(todo, outcomes, strict=True) if ok is True]
    finished(services, topic, [new for _, new in done if new.state in WAITING])
    failed = [o for o in outcomes if isinstance(o, Exception)]
    if failed or len(placed) < len(moving) or unkept:
        raise StoreUnavailable(f"Cassandra unavailable: {failed[0] if failed else 'writes'}")
    count_moves(services, topic, [(row.state, new.state, row.campaign) for row, new in done])
    services.counts.add_upcoming(topic.uid, [row.due_at_ms for row, _ in done
                                             if row.state == "scheduled"], sign=-1)
    services.counts.add_upcoming(topic.uid, [new.due_at_ms for _, new in done
                                             if new.state == "scheduled"])
    for _, new in done:
        progress.changed += 1
        progress.cover(new.deliver_at_ms)
    return [(row, new) for (row, new), ok in zip(todo, outcomes, strict=True) if ok is not True]
