"""Hops: a message asking for a time beyond the horizon is parked there
(app.core.timeline.parked_ms); when it comes due at its parking point, the take moves it on
instead of handing it out.

A payload is written once, at enqueue, to live until the first parking point plus the
horizon. A hop writes it again with a TTL that covers the next span, then moves the message,
pointer first, to its deliver_at or the next horizon, whichever comes first. Its deliver_at,
attempts and state do not change, and nothing is handed out.
"""

from __future__ import annotations

import dataclasses
import logging

from app.core.timeline import MS_PER_DAY, parked_ms, ttl_s
from app.delivery.scan import Due
from app.messages.transitions import move_many
from app.models import Topic
from app.services import Services

log = logging.getLogger("duetime.hops")


def parked(due: Due, now_ms: int) -> bool:
    """Whether a due message asks for a time still ahead (epoch ms): it was parked at the
    horizon, and is moved on, not handed out. No other row is due before its deliver_at."""
    return due.row.deliver_at_ms > now_ms


def hop(services: Services, topic: Topic, parked_due: list[Due], now_ms: int) -> set[str]:
    """Move these parked messages on (payload first, then pointer, then LWT); returns the ids
    moved. One whose payload could not be written, or whose row changed meanwhile, is not
    moved: its pointer stays, to be looked at again. Failures are logged, not raised (the
    take goes on with the other messages)."""
    try:
        return _hop(services, topic, parked_due, now_ms)
    except Exception:
        log.warning("could not move on %d parked messages of topic %s", len(parked_due),
                    topic.uid, exc_info=True)
        return set()


def _hop(services: Services, topic: Topic, parked_due: list[Due], now_ms: int) -> set[str]:
    cfg = services.config
    rows = {d.row.id: d.row for d in parked_due}
    moved = [dataclasses.replace(r, version=r.version + 1, updated_at_ms=now_ms,
                                 due_at_ms=parked_ms(r.deliver_at_ms, now_ms, cfg.horizon_days))
             for r in rows.values()]
    payloads = services.messages.get_payloads(topic.uid,
                                              [(r.id, r.content_hash) for r in moved])
    bodies = [(topic.uid, m.id, m.content_hash, payloads[(m.id, m.content_hash)],
               ttl_s(m.due_at_ms, now_ms, cfg.retention_days, cfg.horizon_days * MS_PER_DAY))
              for m in moved if (m.id, m.content_hash) in payloads]
    errors, _, _ = services.messages.stage(topic.uid, bodies, [])
    unwritten = {body[1] for body, err in zip(bodies, errors, strict=True) if err is not None}
    won = move_many(services, topic, [m for m in moved if m.id not in unwritten], now_ms, rows)
    services.counts.add_upcoming(topic.uid, [rows[m.id].due_at_ms for m in won], sign=-1)
    services.counts.add_upcoming(topic.uid, [m.due_at_ms for m in won])
    return {m.id for m in won}
