"""State transitions shared by the use cases: pointer first, then the LWT; state counters.

A transition that moves a message on the timeline writes its next pointer before the LWT
that makes it current, so a crash between the two leaves at worst a stale pointer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from app.core.timeline import pointer_of
from app.errors import LeaseLost
from app.messages.lifetimes import relist, row_ttl_s
from app.models import MessageState, Topic
from app.ops import metrics
from app.services import Services

WAITING = ("scheduled", "leased")  # states a pointer can hand out (app.delivery.scan)


def place_then(services: Services, topic: Topic, rows: list[MessageState],
                now: int) -> list[MessageState]:
    """Write each row's next pointer; returns the rows whose pointer is durable. Its readers
    are told of it by finished(), once the row's LWT applied."""
    pointers = [pointer_of(r) for r in rows]
    errors = services.placer.place(topic.uid, pointers, now, topic.pushed, wake=False)
    return [r for r, err in zip(rows, errors, strict=True) if err is None]


def finished(services: Services, topic: Topic, rows: Sequence[MessageState]) -> None:
    """Rows whose next pointer and LWT have both landed: their readers are woken
    (PointerPlacer.tell_landed); a waiting one whose write finished late has its pointer
    placed again (PointerPlacer.again_if_late), where the walk reads. One that could not be
    is logged: it waits for a releaser that reads its shard anew."""
    waiting = [pointer_of(r) for r in rows if r.state in WAITING]
    if not waiting:
        return
    services.placer.tell_landed(topic.uid, waiting, services.clock(), topic.pushed)
    stuck = services.placer.again_if_late(topic.uid, waiting, topic.pushed)
    if stuck:
        logging.getLogger(__name__).error(
            "%d messages of topic %s were written late and could not be placed again: %s",
            len(stuck), topic.uid, [p.id for p in stuck[:10]])


def move_many(services: Services, topic: Topic, rows: list[MessageState], now: int,
              before: Mapping[str, MessageState]) -> list[MessageState]:
    """Each row's next pointer, then its LWT over the version before it; returns the rows
    that applied (one whose pointer failed, or whose row changed meanwhile, did not).
    `before`: the rows as read, by id (MessageStore.cas_many)."""
    unlisted = relist(services, topic, [(before[r.id], r) for r in rows if r.id in before], now)
    placed = place_then(services, topic, [r for r in rows if r.id not in unlisted], now)
    outcomes = services.messages.cas_many(
        [(r, r.version - 1, row_ttl_s(r, now, services.config)) for r in placed], before)
    won = [r for r, ok in zip(placed, outcomes, strict=True) if ok is True]
    finished(services, topic, won)
    return won


def apply_transition(services: Services, topic: Topic, new: MessageState, moved: bool,
                     before: MessageState) -> None:
    """CAS new over the version before it; with moved, its pointer first. 409 if lost.
    `before`: the row as read (MessageStore.cas_many)."""
    now = services.clock()
    if moved and (relist(services, topic, [(before, new)], now)
                  or not place_then(services, topic, [new], now)):
        raise LeaseLost("Could not move the message; retry.")
    if not services.messages.cas(new, new.version - 1, row_ttl_s(new, now, services.config),
                                 before):
        raise LeaseLost(f"The lease on {new.id!r} is no longer held.")
    if moved:
        finished(services, topic, [new])


Move = tuple[str | None, str, str | None]  # (state before or None if new, after, campaign)


Deltas = tuple[dict[str, int], dict[str, dict[str, int]]]  # per state; per campaign, per state


def _deltas(moves: Sequence[Move]) -> Deltas:
    """How the topic's per-state counts and each campaign's move."""
    deltas: dict[str, int] = {}
    per_campaign: dict[str, dict[str, int]] = {}
    for before, after, campaign in moves:
        if before == after:
            continue
        for target in [deltas] + ([per_campaign.setdefault(campaign, {})] if campaign else []):
            if before is not None:
                target[before] = target.get(before, 0) - 1
            target[after] = target.get(after, 0) + 1
    return deltas, per_campaign


def _count(services: Services, topic: Topic, deltas: Deltas,
           also: Sequence[tuple[str, Sequence[Any]]] = ()) -> None:
    """Add the counter updates of deltas (zeros left out) and `also` to the process's ledger
    (app.store.counts.CounterLedger), which writes them within its flush period."""
    topic_deltas, per_campaign = deltas
    services.counts.add([*services.counts.state_updates(topic.uid, topic_deltas),
                         *services.campaigns.count_updates(topic.uid, per_campaign), *also])


def count_moves(services: Services, topic: Topic, moves: Sequence[Move],
                also: Sequence[tuple[str, Sequence[Any]]] = ()) -> None:
    """Move the per-state counters of the topic and of each move's campaign by (before,
    after, campaign) moves of applied transitions, and this process's message metrics;
    `also` are more counter updates to count with them. Never fails and never waits: the
    counters are written by the ledger."""
    metrics.count_transitions(topic.tenant, topic.name, [(b, a) for b, a, _ in moves])
    _count(services, topic, _deltas(moves), also)


def count_replace(services: Services, topic: Topic, before: MessageState,
                  after: MessageState) -> None:
    """A scheduled (or paused) message replaced (if_exists replace): its upcoming load moves
    from the old due minute to the new one (a paused one is not in it), and its campaigns'
    counts of its state from the old campaign to the new one."""
    per_campaign: dict[str, dict[str, int]] = {}
    if before.campaign != after.campaign:
        for campaign, sign in ((before.campaign, -1), (after.campaign, 1)):
            if campaign:
                per_campaign[campaign] = {before.state: sign}
    counts = services.counts
    upcoming = [*counts.upcoming_updates_at(topic.uid, [before.due_at_ms], sign=-1),
                *counts.upcoming_updates_at(topic.uid, [after.due_at_ms])] \
        if before.state == "scheduled" else []
    _count(services, topic, ({}, per_campaign), also=upcoming)
