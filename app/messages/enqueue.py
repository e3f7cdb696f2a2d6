"""Enqueue: one message or a batch, idempotent by client id.

Write order per message: payload (plain insert) → state row → pointer. The state row is an LWT
IF NOT EXISTS for a client id; a server-made id cannot exist yet, so its row is a plain write
below every LWT's write time (MessageStore.insert_fresh_many), sent in one batch with its
payload when the message has no campaign (MessageStore.stage: one mutation). Such a message's
pointer and counters are sent beside that batch, so its enqueue is one round trip: a reader
that finds the pointer first leaves it unspent (app.delivery.scan.is_spent), and none is woken for
it before the row is written (_write_fresh).
The server-made ids of one request share one home per shard (app.core.ids.homes_for_request),
each home taking a run of messages adjacent in due time, so each write and each later
transition of those messages is one batch per shard, not one per message (home_by_due_time).
A request of fewer messages than shards (or than SHARED_BELOW, whatever the shards) takes
the process's current home of the topic (app.core.ids.SharedHomes), so one-message enqueues
share homes as a batch's messages do, on a topic of one shard too; so do the one-message
requests of a group commit, however many (app.messages.group_commit).
A 201/200 answer means all three are durable. If the pointer write fails the item answers 503;
retrying the same request re-writes the pointer (the state row is found with the same content).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import secrets
from collections.abc import Sequence
from typing import Any

from app.campaigns import manage as campaigns
from app.core.ids import SHARED_BELOW, homes_for_request, new_message_id
from app.core.timeline import MS_PER_DAY, parked_ms, placement_ms, pointer_of, shard_of, ttl_s
from app.core.timeparse import TimeFormatError, parse_local_time, zone
from app.errors import Conflict, DuetimeError, InvalidInput, PayloadTooLarge, StoreUnavailable
from app.messages import send_windows
from app.messages.by_id import MOVABLE
from app.messages.lifetimes import keep_alive, row_ttl_s
from app.messages.transitions import (
    apply_transition,
    count_moves,
    count_replace,
)
from app.models import MessageState, Payload, Pointer, Topic
from app.services import Services
from app.store.messages import PayloadRow, Staging

log = logging.getLogger(__name__)
RETRIES_ON_RACE = 3
# Deep enough for any real payload, and far from the interpreter's recursion limit (about
# 1,000), which a payload must stay under for every later answer that embeds it.
MAX_PAYLOAD_DEPTH = 64


@dataclasses.dataclass(frozen=True)
class NewMessage:
    """A validated enqueue request. deliver_at_ms is epoch ms."""

    id: str | None
    deliver_at_ms: int
    priority: int
    campaign: str | None
    payload: Payload
    content_hash: str
    group: str | None = None  # fair-delivery group (app.delivery.fairness)
    if_exists: str = "reject"  # what a taken client id does: reject, replace or keep
    # its own send window as its row keeps it (app.messages.send_windows.own_window), and
    # the deliver_at it asked for when the window moved it
    send_window: str | None = None
    requested_ms: int | None = None
    recipient: str | None = None
    labels: dict[str, str] | None = None  # None when it has none
    timezone: str | None = None  # its own IANA zone, when it names one
    cap_exempt: bool | None = None  # frequency_cap: false (None: counted by the topic's cap)


@dataclasses.dataclass(frozen=True)
class EnqueueResult:
    """Per-message outcome: status 201 created, 200 same message existed, else an error."""

    id: str | None
    status: int
    deliver_at_ms: int | None = None
    state: str | None = None
    error: DuetimeError | None = None


def _deliver_at(data: dict[str, Any], now_ms: int) -> int:
    if "deliver_at" in data:
        return int(data["deliver_at"])
    if "delay_ms" in data:
        return now_ms + int(data["delay_ms"])
    if "local_time" in data:
        try:
            return parse_local_time(data["local_time"], data["timezone"])
        except TimeFormatError as exc:
            raise InvalidInput(str(exc), {"local_time": [str(exc)]}) from exc
    return now_ms


def nesting(value: Any) -> int:
    """How deeply a JSON value nests arrays and objects (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def payload_of(data: dict[str, Any], max_bytes: int) -> Payload:
    """The body of a message or a schedule: `payload` (JSON) or `payload_base64`, with
    `headers`; 413 over max_bytes, 400 for bad base64."""
    headers = dict(data.get("headers") or {})
    if "payload_base64" in data:
        try:
            raw = base64.b64decode(data["payload_base64"], validate=True)
        except ValueError as exc:
            raise InvalidInput("payload_base64 is not base64.",
                               {"payload_base64": ["Not valid base64."]}) from exc
        payload = Payload(raw, "base64", headers)
    else:
        if nesting(data["payload"]) > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(f"payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels.",
                               {"payload": [f"At most {MAX_PAYLOAD_DEPTH} levels deep."]})
        text = json.dumps(data["payload"], separators=(",", ":"), ensure_ascii=False)
        payload = Payload(text.encode("utf-8"), "json", headers)
    if len(payload.data) > max_bytes:
        raise PayloadTooLarge(f"Payload is {len(payload.data)} bytes; the limit is {max_bytes}.")
    return payload


def new_message(data: dict[str, Any], now_ms: int, max_payload_bytes: int,
                topic: Topic | None = None) -> NewMessage:
    """Turn one schema-validated message dict into a NewMessage (raises 400/413 errors).
    Given its topic, a message due outside its send window (its own, else the topic's, or
    none with send_window or quiet_hours false) is placed at the window's next opening, in
    the message's zone (app.messages.send_windows)."""
    asked = _deliver_at(data, now_ms)
    own = send_windows.own_window(data)
    try:
        if "timezone" in data:
            zone(data["timezone"])
        rule = None if topic is None else send_windows.rule(topic, own, data.get("timezone"))
    except TimeFormatError as exc:
        raise InvalidInput(str(exc), {"timezone": [str(exc)]}) from exc
    placed = send_windows.place(rule, asked, now_ms)
    deliver = placed.deliver_at_ms
    # empty headers or labels are no headers or labels: a retry may spell them either way
    content = {k: v for k, v in data.items() if k not in ("id", "if_exists")
               and not (k in ("headers", "labels") and not v)}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()
    return NewMessage(data.get("id"), deliver, int(data.get("priority", 100)),
                      data.get("campaign"), payload_of(data, max_payload_bytes), digest[:32],
                      data.get("group"), data.get("if_exists", "reject"), own,
                      placed.requested_ms, recipient=data.get("recipient"),
                      labels=dict(data["labels"]) if data.get("labels") else None,
                      timezone=data.get("timezone"),
                      cap_exempt=True if data.get("frequency_cap") is False else None)


def state_row(topic: Topic, m: NewMessage, message_id: str, now_ms: int,
              horizon_days: int) -> MessageState:
    """The first state row of a new message (version 1, scheduled), as every writer makes it:
    due at its deliver_at, or parked at the horizon (app.core.timeline.parked_ms)."""
    return MessageState(
        topic_uid=topic.uid, id=message_id, state="scheduled", version=1,
        due_at_ms=parked_ms(m.deliver_at_ms, now_ms, horizon_days),
        deliver_at_ms=m.deliver_at_ms,
        priority=m.priority, campaign=m.campaign, shard=shard_of(message_id, topic.settings.shards),
        attempts=0, content_hash=m.content_hash, lease_token=None, lease_expires_at_ms=None,
        consumer=None, last_error=None, created_at_ms=now_ms, updated_at_ms=now_ms, group=m.group,
        send_window=m.send_window, requested_at_ms=m.requested_ms,
        recipient=m.recipient, labels=m.labels, timezone=m.timezone, cap_exempt=m.cap_exempt)


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"Cassandra unavailable: {type(exc).__name__}; retry the same id.")


def home_by_due_time(items: Sequence[NewMessage], shards: int) -> list[int]:
    """The home of each item's server-made id: fresh homes, one per shard
    (app.core.ids.homes_for_request), each given a run of items adjacent in due time. Messages
    that come due together then share a home, so a lease or an ack of what is due now is a
    few conditional batches, not one per shard. The first run goes to a random shard and the
    next ones to the shards after it, so each shard takes as many as any other (a request
    that fills only some shards' runs would otherwise always favour the first shards); the
    releasers hand out what is due across shards in fair order (workers/held.py), so where
    a run lands does not change the order messages are handed out in. enqueue() calls it
    for requests of at least max(shards, SHARED_BELOW) messages; smaller ones and group
    commits share a home (app.core.ids.SharedHomes)."""
    homes = homes_for_request(shards)
    run = max(1, -(-len(items) // shards))
    first = secrets.randbelow(shards)
    by_due = sorted(range(len(items)), key=lambda n: items[n].deliver_at_ms)
    chosen = [0] * len(items)
    for position, n in enumerate(by_due):
        chosen[n] = homes[(first + position // run) % shards]
    return chosen


def enqueue(services: Services, topic: Topic, items: Sequence[NewMessage],
            small_requests: bool = False) -> list[EnqueueResult]:
    """Enqueue items in order; one failed item never fails the others. `small_requests`:
    the items are those of several small requests (a group commit), which share a home
    however many they are, as each would alone."""
    now = services.clock()
    shards = topic.settings.shards
    small = small_requests or len(items) < max(shards, SHARED_BELOW)
    homes = ([services.shared_homes.home(topic.uid, len(items), now)] * len(items) if small
             else home_by_due_time(items, shards))
    rows = [state_row(topic, m, m.id or new_message_id(now, homes[n]), now,
                      services.config.horizon_days)
            for n, m in enumerate(items)]
    results: list[EnqueueResult | None] = [None] * len(items)
    first_of: dict[str, int] = {}
    todo = []
    for index, row in enumerate(rows):
        if row.id in first_of:
            continue  # a repeat inside the batch: answered from the first occurrence below
        first_of[row.id] = index
        todo.append(index)
    _write(services, topic, items, rows, todo, results, now)
    for index, row in enumerate(rows):
        first = first_of[row.id]
        if results[index] is None:
            results[index] = _repeat_answer(results[first], rows[first], row,
                                            items[index].if_exists)
    return [r for r in results if r is not None]


def _repeat_answer(first: EnqueueResult | None, first_row: MessageState,
                   row: MessageState, if_exists: str) -> EnqueueResult:
    """An id repeated inside one request: answered as the first occurrence was (keep: 200
    whatever the content); other content is a conflict, also for replace (which of the two
    would be meant is not known)."""
    assert first is not None
    if if_exists == "keep" and first.status in (200, 201):
        return dataclasses.replace(first, status=200)
    if first_row.content_hash != row.content_hash:
        return EnqueueResult(row.id, 409, error=_conflict(row.id))
    return dataclasses.replace(first, status=200 if first.status == 201 else first.status)


def _conflict(message_id: str) -> DuetimeError:
    return Conflict(f"Message {message_id!r} exists with different content.")


def _write(services: Services, topic: Topic, items: Sequence[NewMessage],
           rows: list[MessageState], todo: list[int], results: list[EnqueueResult | None],
           now: int) -> None:
    stage = _start_stage(services, topic, items, rows,
                         _admitted(services, topic, rows, todo, results), now)
    _write_fresh(services, topic, rows, stage.fresh, stage.writing, results, now)
    inserting = _staged(stage, rows, results)
    outcomes = _insert(services, items, rows, inserting, now)
    created, pointers, placed_for, replacing = [], [], [], []
    for i, outcome in zip(inserting, outcomes, strict=True):
        row = rows[i]
        if isinstance(outcome, Exception):
            results[i] = EnqueueResult(row.id, 503, error=_unavailable(outcome))
        elif outcome[0]:
            created.append(i)
            pointers.append(pointer_of(row, version=1))
            placed_for.append(i)
            results[i] = EnqueueResult(row.id, 201, row.deliver_at_ms, "scheduled")
        elif (items[i].if_exists == "replace" and outcome[1] is not None
              and outcome[1].content_hash != row.content_hash):
            replacing.append((i, outcome[1]))
        else:
            results[i] = _existing(outcome[1], row, now, pointers, placed_for, i,
                                   items[i].if_exists)
    for i, found in replacing:
        results[i] = _replace(services, topic, found, rows[i])
    # a replace into a campaign: its row made, its running cancel or shift applied, its
    # bounds widened, as for a new message
    _cover(services, topic, rows, [i for i, _ in replacing if _fresh(results[i])], results)
    if not pointers:
        return
    count_moves(services, topic, [(None, "scheduled", rows[i].campaign) for i in created],
                also=services.counts.upcoming_updates_at(
                    topic.uid, [rows[i].due_at_ms for i in created]))
    errors = services.placer.place(topic.uid, pointers, now, topic.pushed)
    errors = _placed_in_time(services, topic, pointers, errors)
    for i, err in zip(placed_for, errors, strict=True):
        if err is not None:
            results[i] = EnqueueResult(rows[i].id, 503, error=_unavailable(err))
    _cover(services, topic, rows, [i for i in placed_for if _fresh(results[i])], results)


def _write_fresh(services: Services, topic: Topic, rows: list[MessageState], fresh: list[int],
                 staging: Staging, results: list[EnqueueResult | None], now: int) -> None:
    """Messages with a server-made id and no campaign: their pointers are sent while their
    payload-and-row batches (`staging`) are written, so the whole enqueue is one round trip.
    A reader that finds such a pointer before its row leaves it unspent, as it does a
    transition's pointer written before its LWT (app.delivery.scan.is_spent), and no reader
    is woken for the pointers before the rows are written (PointerPlacer.place's `landed`).
    Each answers 201 when both were written, else 503; one whose row was written is counted
    (one whose pointer alone failed too: its row exists)."""
    if not fresh:
        return
    made = [rows[i] for i in fresh]
    try:
        pointer_errors: list[Exception | None] = services.placer.place(
            topic.uid, [pointer_of(r, version=1) for r in made], now, topic.pushed,
            landed=staging.errors)
    except StoreUnavailable as exc:
        pointer_errors = [exc] * len(made)
    row_errors = staging.errors()[2]
    pointer_errors = _placed_in_time(
        services, topic, [pointer_of(r, version=1) for r in made],
        [row_error or pointer_error
         for row_error, pointer_error in zip(row_errors, pointer_errors, strict=True)])
    for i, row_error, pointer_error in zip(fresh, row_errors, pointer_errors, strict=True):
        err = row_error or pointer_error
        results[i] = (EnqueueResult(rows[i].id, 201, rows[i].deliver_at_ms, "scheduled")
                      if err is None else EnqueueResult(rows[i].id, 503, error=_unavailable(err)))
    written = [r for r, err in zip(made, row_errors, strict=True) if err is None]
    count_moves(services, topic, [(None, "scheduled", None)] * len(written),
                also=services.counts.upcoming_updates_at(topic.uid, [r.due_at_ms for r in written]))


def _placed_in_time(services: Services, topic: Topic, pointers: list[Pointer],
                    errors: list[Exception | None]) -> list[Exception | None]:
    """The errors of written pointers (their rows written too), with one for each whose
    write finished late and could not be placed again in time (PointerPlacer.again_if_late):
    answered 503, its retry writes the pointer again."""
    written = [p for p, err in zip(pointers, errors, strict=True) if err is None]
    stuck = {p.id for p in services.placer.again_if_late(topic.uid, written, topic.pushed)}
    late = StoreUnavailable("Cassandra unavailable: a late write could not be placed again")
    return [late if err is None and p.id in stuck else err
            for p, err in zip(pointers, errors, strict=True)]


def _fresh(result: EnqueueResult | None) -> bool:
    """Accepted, and still waiting as enqueued or replaced (a retry's answer included)."""
    return result is not None and result.status in (200, 201) and result.state in MOVABLE


def _admitted(services: Services, topic: Topic, rows: list[MessageState], todo: list[int],
              results: list[EnqueueResult | None]) -> list[int]:
    """The items whose campaign this process does not know to refuse them (cancelled, or
    being shifted): those get their 409 here, with nothing written."""
    admitted = []
    for i in todo:
        refused = campaigns.refusal(services, topic, rows[i].campaign)
        if refused is None:
            admitted.append(i)
        else:
            results[i] = EnqueueResult(rows[i].id, refused.status, error=refused)
    return admitted


@dataclasses.dataclass(frozen=True)
class _Stage:
    """An enqueue's payloads, campaign index entries and fresh rows being written: `others`
    are the items whose state rows come after (in the order of the stage's payloads),
    `members` those with a campaign (the order of its index entries), `fresh` those whose
    state rows are written with their payloads (the order of its fresh entries)."""

    writing: Staging
    others: list[int]
    members: list[int]
    fresh: list[int]


def _start_stage(services: Services, topic: Topic, items: Sequence[NewMessage],
                 rows: list[MessageState], todo: list[int], now: int) -> _Stage:
    """Start writing payloads and campaign index entries, before any state row: a campaign
    operation that reads the index after a message's row exists finds its entry. A message
    with a server-made id and no campaign has its state row written with its payload, in
    the same round (MessageStore.stage)."""
    cfg = services.config
    slack = cfg.horizon_days * MS_PER_DAY
    members = [i for i in todo if rows[i].campaign]
    fresh = [i for i in todo if items[i].id is None and not rows[i].campaign]
    fresh_set = set(fresh)
    others = [i for i in todo if i not in fresh_set]

    def body(i: int) -> PayloadRow:
        return (topic.uid, rows[i].id, rows[i].content_hash, items[i].payload,
                ttl_s(rows[i].due_at_ms, now, cfg.retention_days, slack))

    writing = services.messages.start_stage(
        topic.uid, [body(i) for i in others],
        [(rows[i].campaign or "", rows[i].id, row_ttl_s(rows[i], now, cfg)) for i in members],
        [(body(i), rows[i], row_ttl_s(rows[i], now, cfg)) for i in fresh])
    return _Stage(writing, others, members, fresh)


def _staged(stage: _Stage, rows: list[MessageState],
            results: list[EnqueueResult | None]) -> list[int]:
    """Of the items whose state rows come after the stage, those whose payload and campaign
    index entry were written; the others answer 503."""
    payload_errors, member_errors, _ = stage.writing.errors()
    index_errors = dict(zip(stage.members, member_errors, strict=True))
    staged = []
    for i, err in zip(stage.others, payload_errors, strict=True):
        err = err or index_errors.get(i)
        if err is None:
            staged.append(i)
        else:
            results[i] = EnqueueResult(rows[i].id, 503, error=_unavailable(err))
    return staged


def _cover(services: Services, topic: Topic, rows: list[MessageState], written: list[int],
           results: list[EnqueueResult | None]) -> None:
    """Campaign messages just written: covered by an operation that started meanwhile
    (app.campaigns.manage.covered), their answers changed to match."""
    fresh = [rows[i] for i in written if rows[i].campaign]
    if not fresh:
        return
    try:
        now_rows = campaigns.covered(services, topic, fresh)
    except StoreUnavailable as exc:
        for i in written:
            if rows[i].campaign:
                results[i] = EnqueueResult(rows[i].id, 503, error=_unavailable(exc))
        return
    for i in written:
        found, result = now_rows.get(rows[i].id), results[i]
        if isinstance(found, DuetimeError):
            results[i] = EnqueueResult(rows[i].id, found.status, error=found)
        elif found is not None and result is not None:
            results[i] = dataclasses.replace(result, deliver_at_ms=found.deliver_at_ms)


def _insert(services: Services, items: Sequence[NewMessage], rows: list[MessageState],
            indexes: list[int], now: int) -> list[tuple[bool, MessageState | None] | Exception]:
    """State rows: IF NOT EXISTS for client ids (idempotency needs the LWT), a plain write for
    server-made ids, which cannot exist yet. Outcomes in the order of indexes."""
    cfg = services.config
    client = [i for i in indexes if items[i].id is not None]
    server = [i for i in indexes if items[i].id is None]
    found = dict(zip(client, services.messages.insert_many(
        [(rows[i], row_ttl_s(rows[i], now, cfg)) for i in client]), strict=True))
    found.update(zip(server, services.messages.insert_fresh_many(
        [(rows[i], row_ttl_s(rows[i], now, cfg)) for i in server]), strict=True))
    return [found[i] for i in indexes]


def _existing(found: MessageState | None, row: MessageState, now: int, pointers: list[Pointer],
              placed_for: list[int], index: int, if_exists: str) -> EnqueueResult:
    """The id was taken: same content is an idempotent retry (pointer re-written while the
    message was never moved), different content a conflict, or with keep the message as it
    is (first one wins)."""
    if found is not None and if_exists == "keep":
        return EnqueueResult(found.id, 200, found.deliver_at_ms, found.state)
    if found is None or found.content_hash != row.content_hash:
        return EnqueueResult(row.id, 409, error=_conflict(row.id))
    if found.state == "scheduled" and found.version == 1:
        pointers.append(pointer_of(found, placement_ms(found.due_at_ms, now), 1))
        placed_for.append(index)
    return EnqueueResult(found.id, 200, found.deliver_at_ms, found.state)


def _replace(services: Services, topic: Topic, found: MessageState,
             row: MessageState) -> EnqueueResult:
    """if_exists replace: while the message is scheduled, its time, priority, campaign,
    group and content (payload and headers, written under the new content hash by the
    stage) become row's, in one conditional write over the version read, its pointer first
    (app.messages.transitions.apply_transition). A reader that took the old version has the old
    payload and time; one that finds the new pointer reads the new row: never a mix. 409
    once it is leased or finished; counters and the campaigns' counts follow the move. A
    paused message is replaced too and stays paused (no pointer until it is resumed).
    Recipient, labels and timezone are content too: they are replaced with it."""
    for _ in range(RETRIES_ON_RACE):
        if found.content_hash == row.content_hash:
            return EnqueueResult(found.id, 200, found.deliver_at_ms, found.state)
        if found.state not in MOVABLE:
            return EnqueueResult(row.id, 409, error=Conflict(
                f"Message {row.id!r} is {found.state}; only a scheduled or paused one is "
                "replaced."))
        now = services.clock()
        new = dataclasses.replace(
            found, version=found.version + 1,
            due_at_ms=parked_ms(row.deliver_at_ms, now, services.config.horizon_days),
            deliver_at_ms=row.deliver_at_ms, priority=row.priority, campaign=row.campaign,
            group=row.group, content_hash=row.content_hash, updated_at_ms=now,
            send_window=row.send_window, requested_at_ms=row.requested_at_ms,
            recipient=row.recipient, labels=row.labels, timezone=row.timezone,
            cap_exempt=row.cap_exempt, paced=False)  # a pace's slot was for the old time
        try:
            if keep_alive(services, topic, [new], now):  # a paused one: its index entry
                return EnqueueResult(row.id, 503, error=_unavailable(
                    StoreUnavailable("campaign index entry not written")))
            apply_transition(services, topic, new, moved=found.state == "scheduled",
                             before=found)
        except Conflict:  # leased, cancelled or replaced meanwhile: decide again
            again = services.messages.get(topic.uid, row.id)
            if again is None:
                return EnqueueResult(row.id, 409, error=_conflict(row.id))
            found = again
            continue
        except StoreUnavailable as exc:
            return EnqueueResult(row.id, 503, error=_unavailable(exc))
        count_replace(services, topic, found, new)
        return EnqueueResult(new.id, 200, new.deliver_at_ms, new.state)
    return EnqueueResult(row.id, 409, error=Conflict(
        f"Message {row.id!r} is changing concurrently; retry."))
