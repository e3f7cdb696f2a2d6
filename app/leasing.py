"""Pull consumption: lease (with long poll), ack, nack, extend.

A lease is a move on the timeline: the pointer at now + lease is written *before* the LWT that
takes the lease, so an unacked message always comes due again. The lease token is the fencing
token: ack, nack and extend check it against the row they read and apply IF version = (that
row's version), so a stale token never changes a message.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence

from app import dead_letters, metrics
from app.errors import (
    Conflict,
    DuetimeError,
    InvalidInput,
    LeaseLost,
    NotFound,
    StoreUnavailable,
)
from app.fairness import fair_order, known_turns_end
from app.found_due import Found
from app.models import MessageState, Payload, Topic
from app.poll_groups import Waiter
from app.pull_ahead import HeldLease
from app.quiet_marks import Cell, QuietMark, buckets_to_count, peek_ms
from app.scan import CellCounts, Due
from app.services import Services
from app.store.campaigns import Campaign
from app.timeline import placement_ms, retry_backoff_ms, ttl_s
from app.transitions import (
    apply_transition,
    count_ahead,
    count_applied,
    count_moves,
    move_many,
    place_then,
)

# Leases write a cursor only when it moves this far: the in-process resume points
# (app.scan.ResumePoints) already skip what was spent, and a cursor left behind costs
# re-reading, never a message. Writing it on every lease cost each lease a round trip.
CURSOR_STEP_MS = 1000
# A pass replaces messages another process took first this many times at most: two
# processes draining one backlog otherwise traded it in ever smaller takes.
TAKE_ROUNDS = 3
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
          lease_s: int, consumer: str | None) -> list[Leased]:
    """Lease up to max_messages due messages; wait up to wait_ms for the first (long poll).
    The calls of this process on one topic are served together (app.poll_groups), and
    messages leased ahead for them are handed out at their due time (app.pull_ahead).
    Webhook topics are delivered by the releasers only: leasing one is a 409."""
    if topic.settings.delivery_mode != "pull":
        raise Conflict(f"Topic {topic.name!r} is a webhook topic; its messages are pushed.")
    brokered = _from_brokers(services, topic, max_messages, wait_ms, Hold(lease_s, consumer))
    if brokered is not None:
        return brokered
    services.pull_wakes.start()
    return services.poll_groups.lease(topic.uid, max_messages, Hold(lease_s, consumer), wait_ms,
                                      lambda waiters: _pass(services, topic, waiters),
                                      lambda waiters: _hand_out(services, topic, waiters),
                                      lambda terms, items: _spill(services, topic, terms, items))


def _from_brokers(services: Services, topic: Topic, max_messages: int, wait_ms: int,
                  hold: Hold) -> list[Leased] | None:
    """The call served by the releasers owning the topic's shards (app.desk): first what
    this process holds that has come due, then what the owners lease for it. None when no
    owner could be asked (the call then finds its messages itself). An owner that answers
    nothing before the call's wait is over (it lost the slots meanwhile) is asked again,
    as read then, every BROKER_RETRY_S."""
    if not services.desk.serves(topic):
        return None
    deadline = time.monotonic() + wait_ms / 1000
    waiter: Waiter[Leased] = Waiter(max_messages, hold, deadline)
    shares: list[list[Leased]] = [[]]
    _hand_held(services, topic, [waiter], shares, services.clock())
    got = shares[0]
    if len(got) >= max_messages:
        return got
    while True:
        left_ms = 0 if got else max(0, round((deadline - time.monotonic()) * 1000))
        taken = services.desk.want(topic, max_messages - len(got), left_ms, hold.lease_s,
                                   hold.consumer, hold)
        if taken is None:
            return got or None
        if taken or got or deadline - time.monotonic() <= BROKER_RETRY_S:
            break
        time.sleep(BROKER_RETRY_S)
    handed_at = services.clock()
    services.lag.observe(topic.uid, "pull", [handed_at - t.due_ms for t in taken])
    return got + [Leased(t.leased, t.payload, t.due_ms) for t in taken]


def _pass(services: Services, topic: Topic,
          waiters: Sequence[Waiter[Leased]]) -> list[list[Leased]]:
    """One pass for these calls: first the messages held for them that are due
    (_hand_held); then the due messages an earlier pass of this process found and left
    (app.found_due); then, for what those did not fill, the due messages of every shard are
    read once, put in fair order (app.fairness.fair_order), and leased in the calls' order
    (a paused campaign's are passed over), each call up to its want on its own terms; a
    message another process took first is replaced by the next due one (in up to
    TAKE_ROUNDS takes). A read looks for at least FIND_AT_LEAST messages, and what it found
    due and this pass left is kept for the next passes. Messages due within the pull
    look-ahead are leased too, for the calls that will still be waiting then, and held
    until their due time (app.pull_ahead). Then the cursors move past what is spent, in
    steps of at least CURSOR_STEP_MS. A pass whose read found nothing lets the topic rest
    (_rest). Returns each call's share."""
    now = services.clock()
    wakes = services.poll_groups.wakes(topic.uid)  # before the read: see PollGroups.rest
    run = _Run(waiters, now)
    services.found_due.catch_up(topic.uid)
    _hand_held(services, topic, waiters, run.shares, now)
    handed = [len(share) for share in run.shares]  # held ones, observed as they were handed
    run.counted = list(handed)  # leased, with or without a payload
    if run.wanted() > 0:
        found = services.found_due.take(topic.uid)
        if found is not None:  # all due by now: nothing to lease ahead or leave untaken
            order = _not_paused(services, topic, found.due)
            used = _take_rounds(services, topic, run, order, ahead_ms=0, patient=[],
                                held_before=0, untaken=[])
            services.found_due.keep(topic.uid, dataclasses.replace(found, due=order[used:]))
    quiet_until = _read_and_take(services, topic, run) if run.wanted() > 0 else None
    if quiet_until is not None and not any(run.shares):
        _rest(services, topic, quiet_until, wakes)
    services.held.hold(topic, run.held)
    services.found_due.took(topic.uid, run.taken)
    services.lag.observe(topic.uid, "pull", [now - m.due_ms for share, first
                                  in zip(run.shares, handed, strict=True) for m in share[first:]])
    return run.shares


# A timeline read for a pass looks for at least this many due messages, and what the pass
# does not take is kept for the next ones (app.found_due): one message per call then costs
# the take alone, not a read of cursors, partitions, pointers and rows first.
FIND_AT_LEAST = 32


@dataclasses.dataclass
class _Run:
    """The state of one pass: its calls, each one's share and count leased so far (with or
    without a payload), what it leased ahead to hold, and its clock (epoch ms)."""

    waiters: Sequence[Waiter[Leased]]
    now: int
    shares: list[list[Leased]] = dataclasses.field(init=False)
    counted: list[int] = dataclasses.field(init=False)
    held: list[HeldLease] = dataclasses.field(default_factory=list)
    taken: list[str] = dataclasses.field(default_factory=list)  # ids of the takes that applied

    def __post_init__(self) -> None:
        self.shares = [[] for _ in self.waiters]
        self.counted = [0] * len(self.waiters)

    def wanted(self) -> int:
        return sum(w.want for w in self.waiters) - sum(self.counted)


def _not_paused(services: Services, topic: Topic, due: list[Due]) -> list[Due]:
    """due without the messages of paused campaigns, which are spent for this pass."""
    paused = passed_over(services, topic, due)
    services.scanner.spend(topic, [d.pointer for d in due if d.row.id in paused])
    return [d for d in due if d.row.id not in paused]


def _read_and_take(services: Services, topic: Topic, run: _Run) -> int | None:
    """Read the due messages of every shard (but the (bucket, shard)s whose cell marks stand:
    app.quiet_marks) and lease them for the run's calls; keep what is left (app.found_due)
    and move the cursors. After a pass that found nothing, when long
    polls may rest (app.pull_wakes), the read peeks further: an idle period, or, for a pass
    not started by a wake-up, to the end of the window of the quiet mark it may leave
    (app.quiet_marks); and where such a mark stands, the topic's write counts are read
    instead of its timeline. When it then found nothing due, could settle every pointer it
    read and was not cut short, returns until when (epoch ms) nothing can come due that it
    did not see but what is written after it (its next pass leases ahead by then): an idle
    period at most, or while its quiet mark stands, which app.quiet_watch checks meanwhile.
    Else None."""
    now, waiters = run.now, run.waiters
    ahead_ms = services.config.pull_ahead_ms
    patient = [n for n, w in enumerate(waiters)
               if w.deadline - time.monotonic() > ahead_ms / 1000] if ahead_ms else []
    held_before = services.held.count(topic.uid) if patient else 0
    if sum(waiters[n].want - run.counted[n] for n in patient) <= held_before:
        ahead_ms = 0  # what is held already fills every call that waits
    mark = services.found_due.mark()
    may_rest = services.pull_wakes.ready()
    if may_rest:  # a standing mark needs no pass before it (a new group's first too)
        still = _still_quiet(services, topic, now, ahead_ms)
        if still is not None:
            return still
    # only after a pass that found nothing: a pass of a busy topic need not read further
    idle_ms = (services.config.pull_idle_ms if may_rest
               and services.poll_groups.found_nothing(topic.uid) else 0)
    quiet: _QuietRead | None = None
    if idle_ms and not services.quiet_marks.woken(topic.uid):
        quiet = _QuietRead.start(services, topic, now)
    peek = (idle_ms if quiet is None
            else peek_ms(idle_ms, ahead_ms, services.config.safety_lag_ms))
    cells = _cell_counts(services, topic, now, quiet) if may_rest else None
    if cells is not None and not services.quiet_marks.dense(topic.uid):
        peek = max(peek, CELL_PEEK_MS)
    result = services.scanner.scan(topic, now, max(run.wanted(), FIND_AT_LEAST),
                                   ahead_ms=ahead_ms, peek_ms=peek,
                                   cells=None if cells is None else cells[1])
    if cells is not None and result.cell_marks is not None:
        services.quiet_marks.keep_cells(topic.uid, result.cell_marks, cells[0],
                                        dense=2 * len(result.cell_marks) < result.cells_read)
    # Lower priority values first, then round-robin across groups (app.fairness), each in
    # the order of deliver_at: messages brought back at once (a campaign resumed, a retry)
    # go in their due order. Otherwise that is timeline order within each lane: what is
    # taken is then a prefix of each partition, which moves its resume point
    # (app.scan.ResumePoints).
    order = fair_order(_not_paused(services, topic, result.due))
    untaken: list[Due] = []
    used = _take_rounds(services, topic, run, order, ahead_ms, patient, held_before, untaken)
    # a read that stopped short may have left out the next turns of a group that runs out
    end = known_turns_end(order, used) if result.cut else len(order)
    services.found_due.keep(topic.uid, Found(now, mark, order[used:end]))
    moves = result.moves(untaken + order[used:])
    services.scanner.advance(topic, {s: ms for s, ms in moves.items()
                                     if ms >= result.cursors_ms[s] + CURSOR_STEP_MS})
    if not idle_ms or order or result.cut or result.unsettled:
        return None
    seen_through = now + ahead_ms + peek if result.next_ms is None else result.next_ms
    kept = None if quiet is None else quiet.keep(services, topic, seen_through)
    if kept is not None:
        return _watched_until(services, topic, kept, seen_through)
    return _quiet_until(services, now, idle_ms, seen_through)


def _quiet_until(services: Services, now: int, idle_ms: int, seen_through_ms: int) -> int:
    """Until when (epoch ms) a topic may rest after a read that saw every pointer due
    before seen_through_ms: an idle period at most, and its next pass leases ahead of the
    first pointer it did not see."""
    return min(now + idle_ms, seen_through_ms - services.config.pull_ahead_ms)


def _watched_until(services: Services, topic: Topic, mark: QuietMark,
                   seen_through_ms: int) -> int:
    """Until when (epoch ms) a topic under a quiet mark may rest: while the mark stands,
    and its next pass leases ahead of the first pointer it did not see. Meanwhile
    app.quiet_watch checks its counts every idle period, with those of the process's other
    quiet topics, and wakes it when they move."""
    services.quiet_watch.watch(topic.uid)
    return (min(services.quiet_marks.stands_until(mark), seen_through_ms)
            - services.config.pull_ahead_ms)


@dataclasses.dataclass(frozen=True)
class _QuietRead:
    """A pass that may leave a quiet mark (app.quiet_marks): the counts and generation
    taken before its timeline read."""

    read_at_ms: int
    generation: int
    buckets: tuple[int, ...]
    counts: dict[tuple[int, int], int]

    @classmethod
    def start(cls, services: Services, topic: Topic, now: int) -> _QuietRead:
        generation = services.quiet_marks.generation(topic.uid)
        buckets = buckets_to_count(now, services.config.bucket_ms, services.config.safety_lag_ms)
        return cls(now, generation, buckets, services.timeline.write_counts(topic.uid, buckets))

    def keep(self, services: Services, topic: Topic, seen_through_ms: int
             ) -> QuietMark | None:
        """The mark left, or None when a wake-up came since this pass began."""
        mark = QuietMark(self.read_at_ms, self.buckets, self.counts, seen_through_ms)
        return mark if services.quiet_marks.keep(topic.uid, mark, self.generation) else None


# How far past its window a pass of a topic that is not dense reads, to learn where each
# (bucket, shard)'s next pointer is: its mark then stands until that one nears (quiet_marks).
CELL_PEEK_MS = 2000


def _cell_counts(services: Services, topic: Topic, now: int, quiet: _QuietRead | None
                 ) -> tuple[int, CellCounts]:
    """The wake-up generation and the write counts for the pass's cell marks
    (app.quiet_marks): the quiet read's when there is one, else sent now, beside the scan's
    first reads (the generation taken before)."""
    if quiet is not None:
        generation, buckets = quiet.generation, quiet.buckets
        pending: Callable[[], dict[Cell, int]] = quiet.counts.copy
    else:
        generation = services.quiet_marks.generation(topic.uid)
        buckets = buckets_to_count(now, services.config.bucket_ms,
                                   services.config.safety_lag_ms)
        pending = services.timeline.start_write_counts(topic.uid, buckets)
    return generation, CellCounts(now, frozenset(buckets), pending,
                                  services.quiet_marks.cells(topic.uid),
                                  services.config.safety_lag_ms)


def _still_quiet(services: Services, topic: Topic, now: int, ahead_ms: int) -> int | None:
    """When the topic's quiet mark stands for this pass (one read of its write counts
    instead of its partitions), until when (epoch ms) it may rest; else None (counts that
    moved drop the mark as a wake-up does, so this pass reads at once and leaves none)."""
    quiet = services.quiet_marks.standing(topic.uid, now + ahead_ms)
    if quiet is None:
        return None
    if services.timeline.write_counts(topic.uid, quiet.buckets) != quiet.counts:
        services.quiet_marks.forget(topic.uid)
        return None
    metrics.QUIET_CHECKS.inc()
    return _watched_until(services, topic, quiet, quiet.seen_through_ms)


def _rest(services: Services, topic: Topic, quiet_until: int, wakes: int) -> None:
    """No interval pass over the topic in this process until quiet_until (epoch ms) unless
    a wake-up comes (app.poll_groups.PollGroups.rest); none at all when a wake-up came
    since this pass began (`wakes`: its read may have missed that write)."""
    rest_s = (quiet_until - services.clock()) / 1000
    if rest_s > services.poll_groups.interval_s:
        services.poll_groups.rest(topic.uid, time.monotonic() + rest_s, wakes)


def _take_rounds(services: Services, topic: Topic, run: _Run, order: list[Due], ahead_ms: int,
                 patient: list[int], held_before: int, untaken: list[Due]) -> int:
    """Lease from `order` for the run's calls, in up to TAKE_ROUNDS takes, and hold those
    leased ahead for the patient calls. Returns how much of `order` was used."""
    waiters, used = run.waiters, 0
    for _ in range(TAKE_ROUNDS):
        chunk, owners, used = _next_chunk(order, used, waiters, run.counted, patient,
                                          held_before + len(run.held), run.now, untaken)
        if not chunk:
            break
        owner_of = {d.row.id: owner for d, owner in zip(chunk, owners, strict=True)}
        before = {d.row.id: d.row for d in chunk}
        holds = [waiters[owner if owner >= 0 else patient[0]].terms for owner in owners]
        for row, payload in take_with_payloads(services, topic, chunk, run.now, holds,
                                               ahead_ms=ahead_ms):
            run.taken.append(row.id)
            owner = owner_of[row.id]
            if owner >= 0:
                run.counted[owner] += 1
                if payload is not None:
                    run.shares[owner].append(Leased(row, payload, before[row.id].due_at_ms))
            elif payload is not None:
                run.held.append(HeldLease(before[row.id].due_at_ms, before[row.id], row,
                                          payload, waiters[patient[0]].terms))
    return used


def _next_chunk(order: list[Due], used: int, waiters: Sequence[Waiter[Leased]],
                counted: list[int], patient: list[int], held: int, now: int,
                untaken: list[Due]) -> tuple[list[Due], list[int], int]:
    """The next messages of `order` (from `used` on) to take, each with its owner: a call
    with room left for one due now, -1 (held) for one due later while fewer are held than
    the patient calls have room for (a call leaves with what its first hand-out finds; the
    rest wait for the consumer's next call, which a steady consumer makes well within
    DUETIME_PULL_GIVE_BACK_MS). Those skipped (due later, enough held) go to `untaken`.
    Returns (chunk, owners, where the next chunk starts)."""
    chunk: list[Due] = []
    owners: list[int] = []
    pending = [0] * len(waiters)
    holding = 0
    while used < len(order):
        d = order[used]
        room = [w.want - counted[n] - pending[n] for n, w in enumerate(waiters)]
        owner: int | None = None
        if d.row.due_at_ms <= now:
            owner = next((n for n, r in enumerate(room) if r > 0), None)
        elif sum(room[n] for n in patient) > held + holding:
            owner = -1  # held while the calls that wait have room for it
        if owner is None and not any(r > 0 for r in room):
            break
        used += 1
        if owner is None:
            untaken.append(d)
            continue
        chunk.append(d)
        owners.append(owner)
        if owner >= 0:
            pending[owner] += 1
        else:
            holding += 1
    return chunk, owners, used


def _hand_out(services: Services, topic: Topic,
              waiters: Sequence[Waiter[Leased]]) -> list[list[Leased]]:
    """The held messages that have come due, to these calls (no read of the timeline)."""
    shares: list[list[Leased]] = [[] for _ in waiters]
    _hand_held(services, topic, waiters, shares, services.clock())
    return shares


def _hand_held(services: Services, topic: Topic, waiters: Sequence[Waiter[Leased]],
               shares: list[list[Leased]], now: int) -> None:
    """Add to the calls' shares the messages held for this topic due by now, earliest first,
    each to a call on its terms with room left. One read checks each is still leased as it
    was taken: one cancelled or moved meanwhile is dropped, never handed out. Due ones no
    call here can take (other terms) are held again until a call comes or they are given
    back (app.pull_ahead)."""
    room = sum(w.want - len(share) for w, share in zip(waiters, shares, strict=True))
    items = services.held.take_due(topic.uid, now, room) if room > 0 else []
    if not items:
        return
    try:
        rows = services.messages.get_many(topic.uid, [i.leased.id for i in items])
    except Exception:
        services.held.put_back(topic, items, offered=False)  # for the next try
        raise
    unmatched: list[HeldLease] = []
    handed_due: list[int] = []
    for item in items:
        row = rows.get(item.leased.id)
        if row is None or row.version != item.leased.version or row.state != "leased":
            continue  # cancelled, moved or made dead meanwhile: not ours to hand out
        owner = next((n for n, w in enumerate(waiters)
                      if w.terms == item.terms and len(shares[n]) < w.want), None)
        if owner is None:
            unmatched.append(item)
            continue
        shares[owner].append(Leased(item.leased, item.payload, item.due_ms))
        handed_due.append(item.due_ms)
    handed_at = services.clock()
    services.lag.observe(topic.uid, "pull", [handed_at - due for due in handed_due])
    services.held.put_back(topic, unmatched)


def _spill(services: Services, topic: Topic, terms: Hold, items: list[Leased]) -> None:
    """What a pass leased for a call a hand-out answered meanwhile: held, due now, for the
    next call on these terms (or given back)."""
    services.held.put_back(topic, [
        HeldLease(m.due_ms, dataclasses.replace(m.row, attempts=m.row.attempts - 1,
                                                consumer=None), m.row, m.payload, terms)
        for m in items], offered=False)


def give_back(services: Services, topic: Topic, items: list[HeldLease]) -> None:
    """Messages leased ahead that no call took: scheduled again, due now (pointer first,
    then the LWT over the lease), the attempt not counted. One changed meanwhile (cancelled,
    or already given back) is left as it is."""
    now = services.clock()
    again = [dataclasses.replace(
        i.leased, state="scheduled", version=i.leased.version + 1,
        due_at_ms=placement_ms(i.due_ms, now), lease_token=None, lease_expires_at_ms=None,
        attempts=i.before.attempts, consumer=i.before.consumer, updated_at_ms=now)
        for i in items]
    won = move_many(services, topic, again, now)
    _spend_lease_pointers(services, topic, [i.leased for i in items])
    count_moves(services, topic, [("leased", "scheduled", r.campaign) for r in won])


def take_with_payloads(services: Services, topic: Topic, chunk: list[Due], now: int,
                       holds: Sequence[Hold], wait_counts: bool = True,
                       ahead_ms: int = 0) -> list[tuple[MessageState, Payload | None]]:
    """take(), with each leased row's payload (None when it is missing). Payloads are
    immutable, so they are read while the take's round trips run, not after them."""
    reading = services.messages.start_payloads(
        topic.uid, [(d.row.id, d.row.content_hash) for d in chunk])
    rows = take(services, topic, chunk, now, holds, wait_counts, ahead_ms)
    payloads = services.messages.collect_payloads(reading)
    return [(r, payloads.get((r.id, r.content_hash))) for r in rows]


def take(services: Services, topic: Topic, chunk: list[Due], now: int, holds: Sequence[Hold],
         wait_counts: bool = True, ahead_ms: int = 0) -> list[MessageState]:
    """Try to lease each due message on the terms of its hold (or make it dead past
    max_attempts); returns the leased. Used by pull leases and by the releasers' webhook push
    alike. Rows not due by now + ahead_ms (this server's clock) are never taken, whatever
    pointer led to them; a lease runs its lease_s from the later of now and the row's due
    time (a releaser prepares a push up to ahead_ms before it and POSTs at the due time,
    never earlier). The campaign's controls apply (app.campaign_rules): a paused campaign's
    messages are not taken, a cancelled campaign's are cancelled instead, and a paced
    campaign's are taken in the order and at the rate of their delivery slots (_pace)."""
    terms = [(d, hold) for d, hold in zip(chunk, holds, strict=True)
             if d.row.due_at_ms <= now + ahead_ms]
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
            continue  # passed over; resuming brings it back (app.campaign_ops)
        elif d.row.attempts >= topic.settings.max_attempts:
            ending.append(dead(d.row, now, "max_attempts reached"))
        elif c is not None and c.max_per_second and not d.row.paced:
            pacing.setdefault(c.name, []).append((d, hold))
        else:
            going.append((d, hold))
    now_due, moving = _pace(services, topic, pacing, rules, now)
    leasing = [_leased(d.row, hold, now) for d, hold in going + now_due]
    placed = place_then(services, topic, leasing + moving, now)
    unrecorded = dead_letters.record(services, topic, ending)
    ending = [r for r in ending if r.id not in unrecorded]
    changes = [(r, r.version - 1, ttl_s(r.due_at_ms, now, services.config.retention_days))
               for r in placed + ending]
    rows = {d.row.id: d.row for d in chunk}
    # a waiting caller's counters go out beside the LWTs, not after them (count_ahead)
    ahead = count_ahead(services, topic, [(rows[r.id].state, r.state, r.campaign)
                                          for r, _, _ in changes]) if wait_counts else None
    outcomes = services.messages.cas_many(changes)
    # a pointer is spent once its row's move was decided (won, or lost to another writer);
    # one whose next pointer or LWT failed stays unspent, or no pass would look at it again
    undecided = {r.id for r in leasing + moving} - {r.id for r in placed} | unrecorded
    undecided |= {r.id for (r, _, _), ok in zip(changes, outcomes, strict=True)
                  if isinstance(ok, Exception)}
    services.scanner.spend(topic, [d.pointer for d, _ in terms if d.row.id not in undecided])
    won = [r for (r, _, _), ok in zip(changes, outcomes, strict=True) if ok is True]
    moves = [(rows[r.id].state, r.state, r.campaign) for r in won]
    if ahead is None:
        count_moves(services, topic, moves, wait=False)
    else:
        count_applied(services, topic, ahead, moves)
    _count_slots(services, topic, [(rows[r.id], r) for r in won
                                   if r.paced and r.state == "scheduled"])
    leased = [r for r in won if r.state == "leased"]
    paced_now = {d.row.id for d, _ in now_due}
    _observe_pacing([rows[r.id] for r in leased], paced_now)
    return leased


def _observe_pacing(taken: list[MessageState], paced_now: set[str]) -> None:
    """For each message just leased (rows as they were before) of a paced campaign, its wait
    for its turn: its slot, or its own due time when its slot had come, less deliver_at.
    (Lag is measured where a message is handed out: a pull's in _pass and _hand_held, a
    push's when its POST starts, workers.push.)"""
    for row in taken:
        if row.paced or row.id in paced_now:
            metrics.PACING_WAIT.observe(max(row.due_at_ms - row.deliver_at_ms, 0) / 1000)


def _leased(row: MessageState, hold: Hold, now: int) -> MessageState:
    expires = max(now, row.due_at_ms) + hold.lease_s * 1000
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
        rate = rules[name].max_per_second or 1.0
        items.sort(key=lambda item: (item[0].row.deliver_at_ms, item[0].row.id))
        # a releaser takes a push up to its lead before the due time: no slot may come
        # before the message's own due time (never early)
        earliest = max(now, min(d.row.due_at_ms for d, _ in items))
        first_us = services.campaigns.reserve_slots(topic.uid, name, len(items), rate,
                                                    earliest)
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


def passed_over(services: Services, topic: Topic, due: Sequence[Due]) -> set[str]:
    """Ids of the messages a take would pass over now: those of paused campaigns."""
    rules = _rules(services, topic, due)
    return {d.row.id for d in due
            if (c := rules.get(d.row.campaign or "")) is not None and c.paused
            and not c.cancelled}


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
    with that token) or the error that pair alone answers (400, 404, 409, 503).

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
    ahead = count_ahead(services, topic, [("leased", "delivered", h.campaign)
                                          for _, _, _, h in blind])
    applied = services.messages.deliver_many(
        topic.uid, [(i, lease, h.version, h.expires_ms, h.campaign) for _, i, lease, h in blind],
        now, services.config.retention_days)
    done = [(i, h.version, h.campaign)
            for (_, i, _, h), ok in zip(blind, applied, strict=True) if ok]
    unsure = {b[0] for b, ok in zip(blind, applied, strict=True) if not ok}
    done += _ack_on_read(services, topic, [(index, i, lease) for index, i, (lease, held)
                                           in presented if not held or index in unsure],
                         answers, now)
    # their lease pointers (_spend_lease_pointers)
    services.scanner.spend_versions(topic, [(i, v) for i, v, _ in done])
    count_applied(services, topic, ahead, [("leased", "delivered", c) for _, _, c in done])
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
         for _, r in todo])
    for (index, r), ok in zip(todo, outcomes, strict=True):
        if isinstance(ok, Exception):
            answers[index] = StoreUnavailable(f"Cassandra unavailable: {type(ok).__name__}")
        elif not ok:
            answers[index] = LeaseLost(f"The lease on {r.id!r} is no longer held.")
    return [(r.id, r.version - 1, r.campaign) for (_, r), ok in zip(todo, outcomes, strict=True)
            if ok is True]


def _spend_lease_pointers(services: Services, topic: Topic, held: list[MessageState]) -> None:
    """Rows as they were leased, whose lease has just been acked, nacked or extended: their
    lease pointer (at the lease's expiry, of that version) can never hand the message out
    again, so this process skips it without a state read when it comes due."""
    services.scanner.spend_versions(topic, [(r.id, r.version) for r in held])


def nack(services: Services, topic: Topic, message_id: str, token: str,
         delay_ms: int | None, error: str | None) -> None:
    """Give the message back: due again after delay_ms (or the topic's backoff), or dead once
    it has had max_attempts leases."""
    row = _held(services, topic, message_id, token)
    now = services.clock()
    if row.attempts >= topic.settings.max_attempts:
        gone = dead(dataclasses.replace(row, last_error=error), now, "max_attempts reached")
        if dead_letters.record(services, topic, [gone]):
            raise StoreUnavailable("Could not record the message as dead; retry.")
        apply_transition(services, topic, gone, moved=False)
        _spend_lease_pointers(services, topic, [row])
        count_moves(services, topic, [("leased", "dead", row.campaign)])
        return
    s = topic.settings
    delay = delay_ms if delay_ms is not None else retry_backoff_ms(
        row.attempts, s.backoff_seconds, s.max_backoff_seconds)
    again = dataclasses.replace(
        row, state="scheduled", version=row.version + 1,
        due_at_ms=placement_ms(now + delay, now), lease_token=None, lease_expires_at_ms=None,
        last_error=error if error is not None else row.last_error, updated_at_ms=now)
    apply_transition(services, topic, again, moved=True)
    _spend_lease_pointers(services, topic, [row])
    count_moves(services, topic, [("leased", "scheduled", row.campaign)])


def extend(services: Services, topic: Topic, message_id: str, token: str,
           lease_s: int) -> MessageState:
    """Keep the lease for lease_s more seconds from now (same token)."""
    row = _held(services, topic, message_id, token)
    now = services.clock()
    expires = now + lease_s * 1000
    longer = dataclasses.replace(row, version=row.version + 1, due_at_ms=expires,
                                 lease_expires_at_ms=expires, updated_at_ms=now)
    apply_transition(services, topic, longer, moved=True)
    _spend_lease_pointers(services, topic, [row])
    return longer
