"""Campaign use cases: view and list, pause / resume, and the cancel and shift operations.

A campaign is every message of a topic carrying the same `campaign`. Its row (created with
its first message) holds its controls and the operation running on it; its counters move
with every transition; its bounds are the earliest and latest deliver_at of its messages.

Operations run in the background (workers/operations.py). Messages enqueued while one runs are
covered by it or refused, never half-handled: an enqueue refuses a campaign that its process
knows is cancelled or being shifted, and after writing reads the campaign again (covered());
an operation is marked on the campaign before it reads the campaign index, so either the
enqueue sees the mark and applies the operation to its own messages, or its index entries
were written before the operation began reading them.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from app.campaigns import operations as campaign_ops
from app.campaigns.rules import REFRESH_MS
from app.core.frequency_cap import capped_counts
from app.core.timeparse import MAX_MS
from app.errors import Conflict, DuetimeError, InvalidInput, NotFound
from app.models import STATES, MessageState, Topic
from app.services import Services
from app.store.campaigns import Campaign, Span
from app.store.operations import Operation

RUNNING_KINDS = {"cancel": "being cancelled", "shift": "being shifted",
                 "resume": "being resumed"}


def get_campaign(services: Services, topic: Topic, name: str) -> Campaign:
    """The campaign's row; 404 when no message of the topic ever carried it."""
    found = services.campaigns.get(topic.uid, name)
    if found is None:
        raise NotFound(f"No campaign {name!r} on topic {topic.name!r}.")
    return found


def _view(services: Services, topic: Topic, c: Campaign, counts: dict[str, int]
          ) -> dict[str, Any]:
    first, last = services.campaigns.bounds(topic.uid, c.name, c.bounds_gen)
    return {
        "campaign": c.name, "counts": {s: max(0, counts.get(s, 0)) for s in STATES},
        "frequency_capped": capped_counts(counts),
        "first_deliver_at": first, "last_deliver_at": last, "paused": c.paused,
        "max_per_second": c.max_per_second, "cancelled": c.cancelled,
        "operation": c.op_id, "created_at": c.created_at_ms,
    }


def campaign_view(services: Services, topic: Topic, name: str) -> dict[str, Any]:
    """Counts by state, bounds and controls: a few single-partition reads, whatever the
    campaign's size."""
    c = get_campaign(services, topic, name)
    return _view(services, topic, c, services.campaigns.counts(topic.uid, [name])[name])


def list_views(services: Services, topic: Topic) -> list[dict[str, Any]]:
    campaigns = services.campaigns.all(topic.uid)
    counts = services.campaigns.counts(topic.uid, [c.name for c in campaigns])
    return [_view(services, topic, c, counts[c.name]) for c in campaigns]


def _busy(c: Campaign) -> Conflict:
    return Conflict(f"Campaign {c.name!r} is {RUNNING_KINDS.get(c.op_kind or '', 'busy')} "
                    f"(operation {c.op_id}); retry once it has finished.")


def start_operation(services: Services, topic: Topic, c: Campaign, kind: str,
                    shift_ms: int = 0) -> Operation:
    """Record the operation, mark it on the campaign (at most one runs; an enqueue that
    sees the mark finds the operation recorded), then list it for the runners. It reads the
    campaign index only after every process has seen the mark."""
    now = services.clock()
    op = Operation(
        topic_uid=topic.uid, id=uuid.uuid1(), tenant=topic.tenant, topic=topic.name, kind=kind,
        campaign=c.name, shift_ms=shift_ms,
        new_gen=c.bounds_gen + 1 if kind == "shift" else None,
        not_before=now + REFRESH_MS + services.config.safety_lag_ms, started_at=now)
    services.operations.record(op)
    other = services.campaigns.begin_op(topic.uid, c.name, op.id, kind, now)
    if other is not None:
        services.operations.finish(op, "failed", "another operation was running", now)
        raise _busy(other)
    services.operations.enlist(op)
    services.waker.wake("operations")
    services.campaign_rules.forget(topic.uid)
    return op


def cancel_campaign(services: Services, topic: Topic, name: str) -> Operation:
    """Start cancelling every not-yet-delivered message of the campaign. The campaign stays
    cancelled: later enqueues into it are refused (409). Asking again while the cancel runs
    answers the same operation."""
    c = get_campaign(services, topic, name)
    if c.op_id is not None and c.op_kind == "cancel":
        running = services.operations.get(topic.uid, c.op_id)
        if running is not None:
            return running
    if c.op_id is not None:
        raise _busy(c)
    return start_operation(services, topic, c, "cancel")


def shift_campaign(services: Services, topic: Topic, name: str, shift_ms: int) -> Operation:
    """Start moving every scheduled message of the campaign by shift_ms (never to before
    now; one moved beyond the horizon waits parked, as an enqueue's would). 400 when its
    latest message would pass the end of year 9999."""
    c = get_campaign(services, topic, name)
    if c.cancelled:
        raise Conflict(f"Campaign {name!r} is cancelled.")
    if c.op_id is not None:
        raise _busy(c)
    _, last = services.campaigns.bounds(topic.uid, name, c.bounds_gen)
    if last is not None and last + shift_ms > MAX_MS:
        raise InvalidInput("The shift would move messages past the end of year 9999.",
                           {"shift_ms": ["The campaign's last message would pass "
                                         "9999-12-31T23:59:59.999Z."]})
    return start_operation(services, topic, c, "shift", shift_ms)


def set_controls(services: Services, topic: Topic, name: str,
                 changes: dict[str, Any]) -> dict[str, Any]:
    """Pause or resume, and set or clear max_per_second. Resuming starts an operation that
    brings the messages that came due while paused back to now (409 while another operation
    runs). A cancelled campaign has nothing left to hold back or pace: 409."""
    _control(services, topic, get_campaign(services, topic, name), changes)
    return campaign_view(services, topic, name)


def _control(services: Services, topic: Topic, c: Campaign,
             changes: dict[str, Any]) -> Operation | None:
    """set_controls' change of campaign c; the resume operation it started, if any."""
    if c.cancelled:
        raise Conflict(f"Campaign {c.name!r} is cancelled.")
    paused = changes.get("paused", c.paused)
    rate = changes.get("max_per_second", c.max_per_second)
    resuming = c.paused and not paused
    if resuming and c.op_id is not None:
        raise _busy(c)
    if not services.campaigns.set_controls(topic.uid, c, paused, rate, services.clock()):
        raise Conflict(f"Campaign {c.name!r} changed concurrently; retry.")
    services.campaign_rules.forget(topic.uid)
    if resuming:
        return start_operation(services, topic, dataclasses.replace(c, paused=False),
                               "resume")
    return None


def pause_or_resume(services: Services, topic: Topic, name: str, paused: bool) -> Operation:
    """Pause or resume the campaign as PATCH {paused} does, as an operation: a resume's
    background operation, or one that has already succeeded (a pause, which changes no
    message, or a resume of a campaign not paused)."""
    c = get_campaign(services, topic, name)
    started = _control(services, topic, c, {"paused": paused})
    if started is not None:
        return started
    now = services.clock()
    done = Operation(topic_uid=topic.uid, id=uuid.uuid1(), tenant=topic.tenant,
                     topic=topic.name, kind="pause" if paused else "resume", campaign=name,
                     state="succeeded", started_at=now, finished_at=now, walked=True)
    services.operations.record(done)
    return done


def get_operation(services: Services, topic: Topic, op_id: str) -> Operation:
    try:
        key = uuid.UUID(op_id)
    except ValueError as exc:
        raise NotFound(f"No operation {op_id!r}.") from exc
    op = services.operations.get(topic.uid, key)
    if op is None:
        raise NotFound(f"No operation {op_id!r}.")
    return op


def refusal(services: Services, topic: Topic, campaign: str | None) -> DuetimeError | None:
    """Why this process refuses a new message of `campaign`, as far as it knows (at most
    campaign_rules' refresh old): the campaign is cancelled, or being shifted."""
    if campaign is None:
        return None
    c = services.campaign_rules.of(topic.uid).get(campaign)
    if c is None:
        return None
    if c.cancelled:
        return Conflict(f"Campaign {campaign!r} is cancelled.")
    if c.op_kind == "shift":
        return _busy(c)
    return None


def covered(services: Services, topic: Topic, rows: list[MessageState]
            ) -> dict[str, MessageState | DuetimeError]:
    """After new messages were written (index entries included): read each of their
    campaigns afresh (creating a new one's row) and cover the messages by an operation
    that started meanwhile: a cancel cancels them (their answer becomes 409), a shift moves
    them. Then the campaigns' bounds cover them. Returns the rows (as they are now) or the
    errors, by id."""
    by_campaign: dict[str, list[MessageState]] = {}
    for r in rows:
        if r.campaign:
            by_campaign.setdefault(r.campaign, []).append(r)
    outcome: dict[str, MessageState | DuetimeError] = {}
    spans: list[tuple[Campaign, Span]] = []
    for name, members in by_campaign.items():
        c = _read_or_create(services, topic, name)
        now_rows = _cover(services, topic, c, members)
        for r in now_rows:
            outcome[r.id] = (Conflict(f"Campaign {name!r} is cancelled.")
                             if r.state == "cancelled" else r)
        spans.append((c, (min(r.deliver_at_ms for r in now_rows),
                          max(r.deliver_at_ms for r in now_rows))))
    widen(services, topic, spans)
    return outcome


def _read_or_create(services: Services, topic: Topic, name: str) -> Campaign:
    """The campaign's row as it is now (made, if this is its first message)."""
    return services.campaigns.get(topic.uid, name) or services.campaigns.create(
        topic.uid, name, services.clock())


def widen(services: Services, topic: Topic, spans: list[tuple[Campaign, Span]]) -> None:
    """Widen each campaign's bounds to cover its span: the generation in force, and the one
    a running shift is filling."""
    widened = {(c.name, gen): span for c, span in spans for gen in _generations(c)}
    if widened:
        services.campaigns.widen(topic.uid, widened)


def widen_to_cover(services: Services, topic: Topic, moved: Sequence[MessageState]) -> None:
    """Widen the bounds of the moved messages' campaigns to cover their deliver_at now (a
    filtered shift, a frequency-cap deferral). One read per campaign; none without one."""
    spans: dict[str, Span] = {}
    for r in moved:
        if r.campaign:
            s = spans.get(r.campaign)
            spans[r.campaign] = (r.deliver_at_ms, r.deliver_at_ms) if s is None else (
                min(s[0], r.deliver_at_ms), max(s[1], r.deliver_at_ms))
    found: list[tuple[Campaign, Span]] = []
    for name, span in spans.items():
        c = services.campaigns.get(topic.uid, name)
        if c is not None:
            found.append((c, span))
    widen(services, topic, found)


def _cover(services: Services, topic: Topic, c: Campaign,
           members: list[MessageState]) -> list[MessageState]:
    """Apply the campaign's running cancel or shift to freshly written members (a cancelled
    campaign's cancel may have finished: they are cancelled all the same)."""
    op: Operation | None = None
    if c.op_id is not None and c.op_kind in ("cancel", "shift"):
        op = services.operations.get(topic.uid, c.op_id)  # recorded before it was marked
    elif not c.cancelled:
        return members
    if op is None:
        op = Operation(topic.uid, uuid.uuid1(), topic.tenant, topic.name, "cancel", c.name)
    campaign_ops.apply(services, topic, op, [m.id for m in members])
    found = services.messages.get_many(topic.uid, [m.id for m in members])
    return [found.get(m.id, m) for m in members]


def _generations(c: Campaign) -> list[int]:
    """The bounds generations a new message widens: the current one, and the one a running
    shift is filling."""
    if c.op_kind == "shift" and c.op_id is not None:
        return [c.bounds_gen, c.bounds_gen + 1]
    return [c.bounds_gen]


def refuse_import(services: Services, topic: Topic, names: list[str]) -> None:
    """Before a bulk import writes anything: 409 if one of its campaigns is cancelled or
    being cancelled or shifted (an import has no check after writing, as an enqueue has)."""
    for name in names:
        c = services.campaigns.get(topic.uid, name)
        if c is not None and (c.cancelled or c.op_kind in ("cancel", "shift")):
            raise Conflict(f"Campaign {name!r} is "
                           f"{'cancelled' if c.cancelled else RUNNING_KINDS[c.op_kind or '']}"
                           "; nothing was imported.")


def record_import(services: Services, topic: Topic, added: dict[str, tuple[int, int, int]],
                  states: dict[str, dict[str, int]] | None = None) -> list[str]:
    """After a bulk import: each campaign's row, bounds and counters for the messages it
    added ({campaign: (count, earliest deliver_at, latest deliver_at)}), all scheduled
    unless `states` gives each campaign's count per state (a restore). Returns warnings
    for campaigns an operation started on while the import ran (their new messages are not
    covered by it; a cancelled campaign's are cancelled when they come due)."""
    warnings = []
    spans: list[tuple[Campaign, Span]] = []
    for name, (_, first, last) in added.items():
        c = _read_or_create(services, topic, name)
        if c.op_kind in ("cancel", "shift"):
            warnings.append(f"campaign {name!r} began an operation ({c.op_kind}) during the "
                            "import")
        spans.append((c, (first, last)))
    widen(services, topic, spans)
    services.campaigns.add_counts(topic.uid, states or {
        name: {"scheduled": count} for name, (count, _, _) in added.items()})
    return warnings
