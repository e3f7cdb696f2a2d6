"""Hops: a message asking for a time beyond the horizon is parked there
(app.core.timeline.parked_ms); when it comes due at its parking point, the take moves it on
instead of handing it out.

A hop moves the message, pointer first, to its deliver_at or the next horizon, whichever
comes first; parked again, its payload and campaign-index entry are first written again to
live as long as its row will (app.messages.lifetimes.keep_alive). Its deliver_at, attempts
and state do not change, and nothing is handed out.
"""

from __future__ import annotations

import dataclasses
import logging

from app.core.timeline import parked_ms
from app.delivery.scan import Due
from app.messages.lifetimes import keep_alive
from app.messages.transitions import move_many
from app.models import Topic
from app.services import Services

log = logging.getLogger("duetime.hops")


def parked(due: Due, now_ms: int) -> bool:
    """Whether a due message asks for a time still ahead (epoch ms): it was parked at the
    horizon, and is moved on, not handed out. No other row is due before its deliver_at."""
    return due.row.deliver_at_ms > now_ms


def hop(services: Services, topic: Topic, parked_due: list[Due], now_ms: int) -> set[str]:
    """Move these parked messages on (payload and index entry first when parked again, then
    pointer, then LWT); returns the ids moved. One whose writes failed, or whose row changed
    meanwhile, is not moved: its pointer stays, to be looked at again. Failures are logged,
    not raised (the take goes on with the other messages)."""
    try:
        return _hop(services, topic, parked_due, now_ms)
    except Exception:
        log.warning("could not move on %d parked messages of topic %s", len(parked_due),
                    topic.uid, exc_info=True)
        return set()


def _hop(services: Services, topic: Topic, parked_due: list[Due], now_ms: int) -> set[str]:
    horizon_days = services.config.horizon_days
    rows = {d.row.id: d.row for d in parked_due}
    moved = [dataclasses.replace(r, version=r.version + 1, updated_at_ms=now_ms,
                                 due_at_ms=parked_ms(r.deliver_at_ms, now_ms, horizon_days))
             for r in rows.values()]
    unkept = keep_alive(services, topic, moved, now_ms)
    won = move_many(services, topic, [m for m in moved if m.id not in unkept], now_ms, rows)
    services.counts.add_upcoming(topic.uid, [rows[m.id].due_at_ms for m in won], sign=-1)
    services.counts.add_upcoming(topic.uid, [m.due_at_ms for m in won])
    return {m.id for m in won}
