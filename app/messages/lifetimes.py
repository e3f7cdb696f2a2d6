"""How long a message's rows live (Cassandra TTLs), and keeping them alive together.

A row lives until its due time plus the retention; its payload the horizon more, so that a
move within the horizon never outlives it. A row that waits without coming due (paused, or
parked at the horizon with its deliver_at ahead: app.core.timeline.parked_ms) lives as long
as its payload instead. Before such a row is written, its payload and its campaign-index
entry are written again to live as long as it will (keep_alive): no row outlives them. A
campaign-index entry lives as long as its row did when it was written, so before a move
sets a row's due time later (a PATCH, a shift, a pace's slot, a cap's deferral, a nack, a
redrive) its entry is written again to live as long as the row will (relist).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.config import Config
from app.core.timeline import MS_PER_DAY, ttl_s
from app.models import MessageState, Topic
from app.services import Services


def slack_ms(state: str, due_ms: int, deliver_ms: int, horizon_days: int) -> int:
    """Life (ms) a row gets past its due time and the retention: the horizon for a row that
    waits without coming due (paused, or parked: its deliver_at still ahead of its due time,
    epoch ms), none for any other."""
    waits_long = state == "paused" or deliver_ms > due_ms
    return horizon_days * MS_PER_DAY if waits_long else 0


def life_slack_ms(row: MessageState, horizon_days: int) -> int:
    """slack_ms of a row."""
    return slack_ms(row.state, row.due_at_ms, row.deliver_at_ms, horizon_days)


def row_ttl_s(row: MessageState, now: int, config: Config) -> int:
    """Seconds a message's row lives after a write at now (epoch ms)."""
    return ttl_s(row.due_at_ms, now, config.retention_days,
                 life_slack_ms(row, config.horizon_days))


def keep_alive(services: Services, topic: Topic, rows: Sequence[MessageState],
               now: int) -> set[str]:
    """Before writing these rows: for each one that waits long (life_slack_ms), its payload
    (due + horizon + retention) and its campaign-index entry (the row's TTL) written again,
    from now (epoch ms). Returns the ids whose writes failed: those rows must not be
    written now (they would outlive their payload). A payload already gone stays gone."""
    cfg = services.config
    long = [r for r in rows if life_slack_ms(r, cfg.horizon_days)]
    if not long:
        return set()
    payloads = services.messages.get_payloads(topic.uid,
                                              [(r.id, r.content_hash) for r in long])
    bodies = [(topic.uid, r.id, r.content_hash, payloads[(r.id, r.content_hash)],
               ttl_s(r.due_at_ms, now, cfg.retention_days, cfg.horizon_days * MS_PER_DAY))
              for r in long if (r.id, r.content_hash) in payloads]
    members = [(r.campaign, r.id, row_ttl_s(r, now, cfg)) for r in long if r.campaign]
    body_errors, member_errors, _ = services.messages.stage(topic.uid, bodies, members)
    return ({b[1] for b, err in zip(bodies, body_errors, strict=True) if err is not None}
            | {m[1] for m, err in zip(members, member_errors, strict=True) if err is not None})


def relist(services: Services, topic: Topic,
           changes: Sequence[tuple[MessageState, MessageState]], now: int) -> set[str]:
    """Before writing these (row as read, row as it will be) moves: for each row of a
    campaign whose due time moves later, its campaign-index entry written again to live as
    long as the new row (row_ttl_s), from now (epoch ms), so that a campaign operation still
    reaches it. Returns the ids whose writes failed: those rows must not be moved now."""
    cfg = services.config
    members = [(new.campaign, new.id, row_ttl_s(new, now, cfg)) for old, new in changes
               if new.campaign and new.due_at_ms > old.due_at_ms]
    if not members:
        return set()
    errors = services.messages.stage(topic.uid, [], members)[1]
    return {m[1] for m, err in zip(members, errors, strict=True) if err is not None}
