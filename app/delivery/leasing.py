"""Pull consumption: lease (with long poll), ack, nack, extend.

A lease is a move on the timeline: the pointer at now + lease is written *before* the LWT that
takes the lease, so an unacked message always comes due again. The lease token is the fencing
token: ack, nack and extend check it against the row they read and apply IF version = (that
row's version), so a stale token never changes a message.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from app.core.timeline import MIN_PER_SECOND, placement_ms, retry_backoff_ms, ttl_s
from app.delivery import frequency_caps, hops
from app.delivery.broker_wire import Taken
from app.delivery.scan import Due
from app.delivery.waits import STAYING, Departure
from app.errors import (
    Conflict,
    DuetimeError,
    InvalidInput,
    LeaseLost,
    NoReleaser,
    NotFound,
    StoreUnavailable,
)
from app.messages import dead_letters
from app.messages.lifetimes import relist
from app.messages.send_windows import retry_due
from app.messages.transitions import (
    apply_transition,
    count_moves,
    finished,
    move_many,
    place_then,
)
from app.models import MessageState, Payload, Topic
from app.ops import metrics
from app.services import Services
from app.store.campaigns import Campaign

log = logging.getLogger("duetime.leasing")

BROKER_RETRY_S = 0.05  # an owner's early empty answer: its slots moved, asked again after this


@dataclasses.dataclass(frozen=True)
class Leased:
    """A message leased for a call: its row as leased, its payload, and when it was due
    (epoch ms; the row's own due time is now the lease's expiry)."""

    row: MessageState
    payload: Payload
    due_ms: int


@dataclasses.dataclass(frozen=True)
class Hold:
    """The terms a message is leased on: for how long (seconds) and to whom (the consumer
    name kept on the row)."""

    lease_s: int
    consumer: str | None


def lease(services: Services, topic: Topic, max_messages: int, wait_ms: int,
          lease_s: int, consumer: str | None,
          gone: Departure = STAYING) -> list[Leased]:
    """Lease up to max_messages due messages; wait up to wait_ms for the first (long poll).
    The releasers owning the topic's shards find and take them (app.delivery.desk, workers.broker).
    NoReleaser (503)
    when no owner could be reached within the wait. Webhook topics are delivered by the
    releasers only: leasing one is a 409. A call whose client left (`gone`) ends at once
    with nothing; what was leased for it goes back, its attempt not counted."""
    if topic.settings.delivery_mode != "pull":
        raise Conflict(f"Topic {topic.name!r} is a webhook topic; its messages are pushed.")
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        left_ms = max(0, round((deadline - time.monotonic()) * 1000))
        taken = services.desk.want(topic, max_messages, left_ms, lease_s, consumer,
                                   functools.partial(give_back, services, topic), gone)
        if taken and gone():
            give_back(services, topic, taken)
            return []
        if taken:
            services.lag.observe(topic.uid, "pull", [services.clock() - t.due_ms
                                                     for t in taken])
            return [Leased(t.leased, t.payload, t.due_ms) for t in taken]
        if deadline - time.monotonic() <= BROKER_RETRY_S or gone():
            if taken is None:
                raise NoReleaser(f"No releaser serving topic {topic.name!r} could be "
                                 "reached; retry.")
            return []
        # no owner reachable (None, or [] while the slots are handed over), or one
        # answered early with nothing (it lost the slots): ask again, as read then, until
        # the call's wait is over
        time.sleep(BROKER_RETRY_S)


def give_back(services: Services, topic: Topic, items: list[Taken]) -> list[MessageState]:
    """Messages a releaser leased for a call that had gone: scheduled again, due now (pointer
    first, then the LWT over the lease), the attempt not counted; returns the rows given
    back. One changed meanwhile (cancelled, or acked) is left as it is. A failure is logged,
    not raised: their leases run out instead (late, never lost)."""
    try:
        return _give_back(services, topic, items)
    except Exception:
        log.warning("could not give back %d messages of topic %s", len(items), topic.uid,
                    exc_info=True)
        return []


def _give_back(services: Services, topic: Topic, items: list[Taken]) -> list[MessageState]:
    now = services.clock()
    again = [dataclasses.replace(
        i.leased, state="scheduled", version=i.leased.version + 1,
        due_at_ms=placement_ms(i.due_ms, now), lease_token=None, lease_expires_at_ms=None,
        attempts=i.before_attempts, consumer=i.before_consumer, updated_at_ms=now)
        for i in items]
    won = move_many(services, topic, again, now, {i.leased.id: i.leased for i in items})
    # the releaser's own give-backs (workers.broker) skip their lease pointers: only those
    # given back, for one whose write failed is still leased, and its lease pointer is what
    # brings it back when the lease runs out
    given = {r.id for r in won}
    services.scanner.spend_versions(
        topic, [(i.leased.id, i.leased.version) for i in items if i.leased.id in given])
    count_moves(services, topic, [("leased", "scheduled", r.campaign) for r in won])
    frequency_caps.give_back(services, topic, won)
    return won


def take_with_payloads(services: Services, topic: Topic, chunk: list[Due], now: int,
                       holds: Sequence[Hold]) -> list[tuple[MessageState, Payload | None]]:
    """take(), with each leased row's payload (None when it is missing). Payloads are
    immutable, so they are read while the take's round trips run, not after them."""
    reading = services.messages.start_payloads(
        topic.uid, [(d.row.id, d.row.content_hash) for d in chunk])
    rows = take(services, topic, chunk, now, holds)
    payloads = services.messages.collect_payloads(reading)
    return [(r, payloads.get((r.id, r.content_hash))) for r in rows]


def take(services: Services, topic: Topic, chunk: list[Due], now: int,
         holds: Sequence[Hold]) -> list[MessageState]:
    """Try to lease each due message on the terms of its hold (or make it dead past
    max_attempts); returns the leased. Used by pull leases and by the releasers' webhook push
    alike, for a consumer's call that waits or a POST that starts at once: nothing is leased
    ahead. Rows not due by now (this server's clock, epoch ms) are never taken, whatever
    pointer led to them, nor rows whose deliver_at is still ahead (parked at the horizon:
    app.delivery.hops moves them on); a lease runs its lease_s from now. The campaign's
    controls apply (app.campaigns.rules): a paused campaign's messages are not taken, a cancelled
    campaign's are cancelled instead, and a paced campaign's are taken in the order and at
    the rate of their delivery slots (_pace)."""
    terms = [(d, hold) for d, hold in zip(chunk, holds, strict=True)
             if d.row.due_at_ms <= now]
    ahead = [d for d, _ in terms if hops.parked(d, now)]
    if ahead:  # parked at the horizon: moved on, never handed out before deliver_at
        moved = hops.hop(services, topic, ahead, now)
        services.scanner.spend(topic, [d.pointer for d in ahead if d.row.id in moved])
        terms = [(d, hold) for d, hold in terms if not hops.parked(d, now)]
    rules = _rules(services, topic, [d for d, _ in terms])
    going: list[tuple[Due, Hold]] = []
    ending: list[MessageState] = []
    pacing: dict[str, list[tuple[Due, Hold]]] = {}
    for d, hold in terms:
        c = rules.get(d.row.campaign or "")
        if c is not None and c.cancelled:
            ending.append(dataclasses.replace(
                d.row, state="cancelled", version=d.row.version + 1, lease_token=None,
                lease_expires_at_ms=None, updated_at_ms=now, last_op=c.op_id or d.row.last_op))
        elif c is not None and c.paused:
            continue  # passed over; resuming brings it back (app.campaigns.operations)
        elif attempts_used_up(topic, d.row):
            ending.append(dead(d.row, now, "max_attempts reached"))
        elif c is not None and c.max_per_second and not d.row.paced:
            pacing.setdefault(c.name, []).append((d, hold))
        else:
            going.append((d, hold))
    now_due, moving = _pace(services, topic, pacing, rules, now)
    capping = frequency_caps.admit(services, topic, [d.row for d, _ in going + now_due], now)
    leasing = [_leased(d.row, hold, now) for d, hold in going + now_due
               if capping.goes(d.row.id)]
    moving += [r for r in capping.capped.values() if r.state == "scheduled"]
    ending += [r for r in capping.capped.values() if r.state == "cancelled"]
    rows = {d.row.id: d.row for d in chunk}
    # a pace's slot or a cap's deferral may be later than the campaign entry lives
    unlisted = relist(services, topic, [(rows[r.id], r) for r in moving], now)
    placed = place_then(services, topic,
                        leasing + [r for r in moving if r.id not in unlisted], now)
    unrecorded = dead_letters.record(services, topic, ending)
    ending = [r for r in ending if r.id not in unrecorded]
    changes = [(r, r.version - 1, ttl_s(r.due_at_ms, now, services.config.retention_days))
               for r in placed + ending]
    outcomes = services.messages.cas_many(changes, before=rows)
    # a change this process left undecided before may have applied after all: its row
    # is handed out as stored, not left leased to nobody until its lease runs out
    earlier = services.messages.earlier_changes(changes, outcomes)
    # a pointer is spent once its row's move was decided (won, or lost to another writer);
    # one whose next pointer or LWT failed stays unspent, or no pass would look at it again
    undecided = ({r.id for r in leasing + moving} - {r.id for r in placed} | unrecorded
                 | capping.later)
    undecided |= {r.id for (r, _, _), ok in zip(changes, outcomes, strict=True)
                  if isinstance(ok, Exception)}
    services.scanner.spend(topic, [d.pointer for d, _ in terms if d.row.id not in undecided])
    won = [earlier.get(n, r)
           for n, ((r, _, _), ok) in enumerate(zip(changes, outcomes, strict=True))
           if ok is True or n in earlier]
    finished(services, topic, won)
    count_moves(services, topic, [(rows[r.id].state, r.state, r.campaign) for r in won])
    try:  # the take has applied: what it leased is handed out whatever becomes of this
        frequency_caps.settle(services, topic, capping, rows, won, undecided)
    except Exception:  # slots not given back are freed by the holder check, late not lost
        log.warning("frequency-cap slots of topic %s not settled", topic.uid, exc_info=True)
    _count_slots(services, topic, [(rows[r.id], r) for r in won
                                   if r.paced and r.state == "scheduled"])
    leased = [r for r in won if r.state == "leased"]
    paced_now = {d.row.id for d, _ in now_due}
    _observe_pacing([rows[r.id] for r in leased], paced_now)
    return leased


def _observe_pacing(taken: list[MessageState], paced_now: set[str]) -> None:
    """For each message just leased (rows as they were before) of a paced campaign, its wait
    for its turn: its slot, or its own due time when its slot had come, less deliver_at.
    (Lag is measured where a message is handed out: a pull's when its call gets it, lease(),
    a push's when its POST starts, workers.push.)"""
    for row in taken:
        if row.paced or row.id in paced_now:
            metrics.PACING_WAIT.observe(max(row.due_at_ms - row.deliver_at_ms, 0) / 1000)


def _leased(row: MessageState, hold: Hold, now: int) -> MessageState:
    """The row leased on the hold's terms from now (epoch ms), its hand-out moment."""
    expires = now + hold.lease_s * 1000
    return dataclasses.replace(
        row, state="leased", version=row.version + 1, due_at_ms=expires,
        lease_token=uuid.uuid4(), lease_expires_at_ms=expires, attempts=row.attempts + 1,
        consumer=hold.consumer, updated_at_ms=now, paced=False)


def _pace(services: Services, topic: Topic, pacing: dict[str, list[tuple[Due, Hold]]],
          rules: dict[str, Campaign], now: int
          ) -> tuple[list[tuple[Due, Hold]], list[MessageState]]:
    """Per paced campaign, reserve one delivery slot for each of these messages, in due
    order, from the slots all processes share (CampaignStore.reserve_slots). A message whose
    slot has come is taken now; the others move to their slot (pointer first), where they
    are taken as they come due, without being paced again. Returns (taken now, moved)."""
    now_due: list[tuple[Due, Hold]] = []
    moving: list[MessageState] = []
    for name, items in pacing.items():
        rate = max(rules[name].max_per_second or 1.0, MIN_PER_SECOND)  # one set before a floor
        items.sort(key=lambda item: (item[0].row.deliver_at_ms, item[0].row.id))
        first_us = services.campaigns.reserve_slots(topic.uid, name, len(items), rate, now)
        for index, (d, hold) in enumerate(items):
            slot_ms = max((first_us + round(index * 1_000_000 / rate)) // 1000,
                          d.row.due_at_ms)
            if slot_ms <= now:
                now_due.append((d, hold))
                continue
            moving.append(dataclasses.replace(
                d.row, state="scheduled", version=d.row.version + 1, due_at_ms=slot_ms,
                lease_token=None, lease_expires_at_ms=None, updated_at_ms=now, paced=True))
    return now_due, moving


def _count_slots(services: Services, topic: Topic,
                 moved: list[tuple[MessageState, MessageState]]) -> None:
    """The upcoming-load counters of messages moved to their delivery slots."""
    if moved:
        services.counts.add_upcoming(topic.uid, [old.due_at_ms for old, _ in moved
                                                 if old.state == "scheduled"], sign=-1)
        services.counts.add_upcoming(topic.uid, [new.due_at_ms for _, new in moved])


def _rules(services: Services, topic: Topic, due: Sequence[Due]) -> dict[str, Campaign]:
    """The controls of the campaigns among these messages (none read when none has one)."""
    if not any(d.row.campaign for d in due):
        return {}
    return services.campaign_rules.of(topic.uid)


def pauses(services: Services, topic: Topic) -> Callable[[MessageState], bool]:
    """Whether a take would pass the message over now: its campaign is paused."""
    return _campaign_test(services, topic, lambda c: c.paused and not c.cancelled)


def stopped(services: Services, topic: Topic) -> Callable[[MessageState], bool]:
    """Whether the message's campaign is paused or cancelled now (a take passes or
    cancels it)."""
    return _campaign_test(services, topic, lambda c: c.paused or c.cancelled)


def _campaign_test(services: Services, topic: Topic, test: Callable[[Campaign], bool]
                   ) -> Callable[[MessageState], bool]:
    """Whether `test` holds for the message's campaign; the campaigns' controls are read
    at the first message with a campaign."""
    rules: dict[str, Campaign] | None = None

    def holds(row: MessageState) -> bool:
        nonlocal rules
        if not row.campaign:
            return False
        if rules is None:
            rules = services.campaign_rules.of(topic.uid)
        found = rules.get(row.campaign)
        return found is not None and test(found)

    return holds


def attempts_used_up(topic: Topic, row: MessageState) -> bool:
    """Whether the message has had the topic's max_attempts: it is made dead, never leased
    or posted again."""
    return row.attempts >= topic.settings.max_attempts


def dead(row: MessageState, now: int, reason: str) -> MessageState:
    """The row made dead (no more attempts), keeping the last error seen."""
    return dataclasses.replace(row, state="dead", version=row.version + 1, lease_token=None,
                               lease_expires_at_ms=None, updated_at_ms=now,
                               last_error=row.last_error or reason)


def token_of(row: MessageState) -> str:
    """The lease token a consumer is given: the row's lease token, the version the row was
    leased at, the lease's expiry (epoch ms) and the campaign (for its counters), so that an
    ack is one conditional write with no read before it. Opaque to consumers; a bare token
    (the uuid alone) is accepted too."""
    return f"{row.lease_token}.{row.version}.{row.lease_expires_at_ms}.{row.campaign or ''}"


@dataclasses.dataclass(frozen=True)
class Held:
    """What a full token says of its lease: the version leased, its expiry (epoch ms) and
    the message's campaign. The ack's condition checks all three."""

    version: int
    expires_ms: int
    campaign: str | None


Presented = tuple[uuid.UUID, Held | None]  # lease token, what a full token adds


def _parsed(token: str) -> Presented:
    """The parts of a token from token_of (or a bare one); 400 if malformed. Campaign names
    may hold dots, so the campaign is everything after the third dot. A token of the form
    before campaigns (no campaign part) is decided on a read, as a bare one is."""
    text, *rest = token.split(".", 3)
    try:
        lease = uuid.UUID(text)
        version, expires_ms = (int(part) for part in rest[:2]) if rest else (0, 0)
        if len(rest) != 3:
            return lease, None
        return lease, Held(version, expires_ms, rest[2] or None)
    except ValueError as exc:
        raise InvalidInput("lease_token is malformed.",
                           {"lease_token": ["Not a lease token."]}) from exc


def _token(token: str) -> uuid.UUID:
    return _parsed(token)[0]


def _check_held(message_id: str, row: MessageState | None, presented: uuid.UUID,
                now: int) -> MessageState:
    """The row, if `presented` holds an unexpired lease on it; else 404 or 409."""
    if row is None:
        raise NotFound(f"No message {message_id!r}.")
    if row.state != "leased" or row.lease_token != presented or (
            row.lease_expires_at_ms or 0) <= now:
        raise LeaseLost(f"The lease on {message_id!r} is no longer held "
                        f"(message is {row.state}).")
    return row


def _held(services: Services, topic: Topic, message_id: str, token: str) -> MessageState:
    """The row, if `token` holds an unexpired lease on it; else 400, 404 or 409."""
    presented = _token(token)
    return _check_held(message_id, services.messages.get(topic.uid, message_id), presented,
                       services.clock())


def ack_many(services: Services, topic: Topic,
             acks: list[tuple[str, str]]) -> list[DuetimeError | None]:
    """Ack many (id, lease_token) pairs at once. Per pair None (delivered, or already acked
    with that token) or the error that pair alone answers (400, 404, 409, 503); a pair
    given twice is decided once and answered alike, as a repeated single ack would be."""
    first = {pair: n for n, pair in reversed(list(enumerate(acks)))}
    once = sorted(set(first.values()))
    decided = dict(zip(once, _ack_each(services, topic, [acks[n] for n in once]),
                       strict=True))
    return [decided[first[pair]] for pair in acks]


def _ack_each(services: Services, topic: Topic,
              acks: list[tuple[str, str]]) -> list[DuetimeError | None]:
    """ack_many for pairs that differ.

    First, with no read, one conditional batch per home for the pairs whose token carries
    its version (token_of): that applies for every lease still held as it was leased. The
    rest (extended leases, bare tokens, and every pair that did not apply) are decided on a
    read of their rows: a repeat ack with the token that acked is a no-op, a lost lease is
    409, a missing message 404."""
    now = services.clock()
    answers: list[DuetimeError | None] = [None] * len(acks)
    presented: list[tuple[int, str, Presented]] = []
    for index, (message_id, token) in enumerate(acks):
        try:
            presented.append((index, message_id, _parsed(token)))
        except DuetimeError as err:
            answers[index] = err
    blind = [(index, i, lease, held) for index, i, (lease, held) in presented if held]
    applied = services.messages.deliver_many(
        topic.uid, [(i, lease, h.version, h.expires_ms, h.campaign) for _, i, lease, h in blind],
        now, services.config.retention_days)
    done = [(i, h.version, h.campaign)
            for (_, i, _, h), ok in zip(blind, applied, strict=True) if ok]
    unsure = {b[0] for b, ok in zip(blind, applied, strict=True) if not ok}
    done += _ack_on_read(services, topic, [(index, i, lease) for index, i, (lease, held)
                                           in presented if not held or index in unsure],
                         answers, now)
    count_moves(services, topic, [("leased", "delivered", c) for _, _, c in done])
    return answers


def _ack_on_read(services: Services, topic: Topic, presented: list[tuple[int, str, uuid.UUID]],
                 answers: list[DuetimeError | None], now: int
                 ) -> list[tuple[str, int, str | None]]:
    """Acks decided on a read of their rows (one IN read per home, the LWTs concurrently);
    sets each one's answer; returns the (id, leased version, campaign) of those delivered
    now."""
    if not presented:
        return []
    rows = services.messages.get_many(topic.uid, [i for _, i, _ in presented])
    todo: list[tuple[int, MessageState]] = []
    for index, message_id, token in presented:
        row = rows.get(message_id)
        if row is not None and row.state == "delivered" and row.lease_token == token:
            continue
        try:
            held = _check_held(message_id, row, token, now)
        except DuetimeError as err:
            answers[index] = err
            continue
        todo.append((index, dataclasses.replace(held, state="delivered", version=held.version + 1,
                                                due_at_ms=now, updated_at_ms=now)))
    outcomes = services.messages.cas_many(
        [(r, r.version - 1, ttl_s(r.due_at_ms, now, services.config.retention_days))
         for _, r in todo], before=rows)
    for (index, r), ok in zip(todo, outcomes, strict=True):
        if isinstance(ok, Exception):
            answers[index] = StoreUnavailable(f"Cassandra unavailable: {type(ok).__name__}")
        elif not ok:
            answers[index] = LeaseLost(f"The lease on {r.id!r} is no longer held.")
    return [(r.id, r.version - 1, r.campaign) for (_, r), ok in zip(todo, outcomes, strict=True)
            if ok is True]


def nack(services: Services, topic: Topic, message_id: str, token: str,
         delay_ms: int | None, error: str | None) -> None:
    """Give the message back: due again after delay_ms (or the topic's backoff), moved to its
    send window's next opening when that falls outside it, or dead once it has had
    max_attempts leases."""
    row = _held(services, topic, message_id, token)
    now = services.clock()
    if attempts_used_up(topic, row):
        gone = dead(dataclasses.replace(row, last_error=error), now, "max_attempts reached")
        if dead_letters.record(services, topic, [gone]):
            raise StoreUnavailable("Could not record the message as dead; retry.")
        apply_transition(services, topic, gone, moved=False, before=row)
        count_moves(services, topic, [("leased", "dead", row.campaign)])
        frequency_caps.give_back(services, topic, [row])
        return
    s = topic.settings
    delay = delay_ms if delay_ms is not None else retry_backoff_ms(
        row.attempts, s.backoff_seconds, s.max_backoff_seconds)
    again = dataclasses.replace(
        row, state="scheduled", version=row.version + 1,
        due_at_ms=placement_ms(retry_due(topic, row, now + delay), now), lease_token=None,
        lease_expires_at_ms=None,
        last_error=error if error is not None else row.last_error, updated_at_ms=now)
    apply_transition(services, topic, again, moved=True, before=row)
    count_moves(services, topic, [("leased", "scheduled", row.campaign)])
    frequency_caps.give_back(services, topic, [row])  # nobody was notified


def extend(services: Services, topic: Topic, message_id: str, token: str,
           lease_s: int) -> MessageState:
    """Keep the lease for lease_s more seconds from now (same token)."""
    row = _held(services, topic, message_id, token)
    now = services.clock()
    expires = now + lease_s * 1000
    longer = dataclasses.replace(row, version=row.version + 1, due_at_ms=expires,
                                 lease_expires_at_ms=expires, updated_at_ms=now)
    apply_transition(services, topic, longer, moved=True, before=row)
    return longer
