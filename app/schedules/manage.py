"""Recurring schedules: each fire is an ordinary message `{name}:{fire time in epoch ms}`,
due at the fire time (placed at the next opening of the topic's send window, in the
schedule's zone, if it falls outside it), produced AHEAD_MS before it by the releaser owning
the schedule's slot (produce()).

A fire is produced exactly once however many releasers run: its id is deterministic
(IF NOT EXISTS), and the schedule's cursor next_fire moves only by LWT from the value read.
Fires whose time passed while nothing produced them (an outage longer than AHEAD_MS, less
MISFIRE_GRACE_MS) follow the schedule's misfire rule: fire_once produces the latest of them
only, skip none. Each fire is also listed in the campaign index under the name `~{name}`
(which no campaign can have), before it is enqueued, so a replace or a delete finds the fires
produced and not yet handed out: a replace rewrites those that are still fires of the new
schedule and cancels the others, a delete cancels them all. A releaser whose cursor move
fails because the schedule was replaced or deleted meanwhile does the same for what it had
just produced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from typing import Any

from app.core.timeline import MS_PER_DAY, placement_ms, schedule_slot_of, ttl_s
from app.core.timeparse import TimeFormatError
from app.errors import Conflict, InvalidInput, NotFound
from app.messages import send_windows
from app.messages.by_id import cancel
from app.messages.enqueue import NewMessage, enqueue, payload_of
from app.messages.lifetimes import row_ttl_s
from app.messages.transitions import finished, place_then
from app.models import MessageState, Payload, Topic
from app.schedules.cron import Cron, CronError
from app.services import Services
from app.store.schedules import Schedule

AHEAD_MS = 2000  # fires are produced this long before their time
MISFIRE_GRACE_MS = 1000  # a fire this late is still produced; later ones are misfires
MAX_FIRES_PER_PRODUCE = 10_000  # fires looked at in one step after a long outage
NEXT_FIRE_TIMES = 5
PAGE = 500
log = logging.getLogger("duetime.schedules")


def fire_id(name: str, fire_ms: int) -> str:
    return f"{name}:{fire_ms}"


def fires_index(name: str) -> str:
    """The campaign-index name under which a schedule's fires are listed."""
    return f"~{name}"


def _cron(data: dict[str, Any]) -> Cron:
    try:
        return Cron(data["cron"], data["timezone"])
    except CronError as exc:
        raise InvalidInput(f"Invalid cron: {exc}", {"cron": [str(exc)]}) from exc
    except TimeFormatError as exc:
        raise InvalidInput(str(exc), {"timezone": [str(exc)]}) from exc


def _before_end(s: Schedule, fire: int | None) -> int | None:
    """The fire, unless there is none or it comes after the schedule's end_at."""
    return None if fire is None or (s.end_at is not None and fire > s.end_at) else fire


def _first_fire(cron: Cron, s: Schedule, from_ms: int) -> int | None:
    """The first fire at or after from_ms (and start_at), unless past end_at."""
    return _before_end(s, cron.next_after(max(from_ms, s.start_at or from_ms) - 1))


def _body(services: Services, topic: Topic, name: str, data: dict[str, Any],
          now: int) -> Schedule:
    # an end_at at or before start_at is taken, as one already past is: no fire, ever
    start, end = data.get("start_at"), data.get("end_at")
    payload = payload_of(data, services.config.max_payload_bytes)
    return Schedule(topic.uid, name, data["cron"], data["timezone"], payload.data,
                    payload.encoding, data.get("priority", 100), data.get("campaign"), start,
                    end, data.get("misfire", "fire_once"), 1, None, now, now)


def put_schedule(services: Services, topic: Topic, name: str,
                 data: dict[str, Any]) -> tuple[Schedule, bool]:
    """Create or replace a schedule; (the schedule, created). A replace rewrites the fires
    already produced and not handed out (409 if that would move them to another campaign).
    A cancelled campaign takes no fire, as it takes no message: 409."""
    cron = _cron(data)
    campaign = data.get("campaign") and services.campaigns.get(topic.uid, data["campaign"])
    if campaign and campaign.cancelled:
        raise Conflict(f"Campaign {campaign.name!r} is cancelled: it takes no fire.")
    for _ in range(3):
        now = services.clock()
        new = _body(services, topic, name, data, now)
        current = services.schedules.get(topic.uid, name)
        if current is None:
            made = dataclasses.replace(new, next_fire=_first_fire(cron, new, now))
            if services.schedules.create(made):
                _list(services, made)
                return made, True
            continue
        if new.campaign != current.campaign and _pending(services, topic, name):
            raise Conflict(f"Schedule {name!r} has fires waiting in campaign "
                           f"{current.campaign!r}; delete it to change its campaign.")
        made = dataclasses.replace(new, version=current.version + 1,
                                   created_at=current.created_at,
                                   next_fire=_first_fire(cron, new, now))
        if services.schedules.replace(made, current.version):
            # after the LWT, not before: a fire a releaser lists and makes under the old
            # version is then either found here or refused its cursor move (it rewrites it)
            rewrite_fires(services, topic, current, made)
            _list(services, made)
            return made, False
    raise Conflict(f"Schedule {name!r} changed concurrently; retry.")


def _slot(services: Services, s: Schedule) -> int:
    return schedule_slot_of(str(s.topic_uid), s.name, services.config.release_slots)


def _list(services: Services, s: Schedule) -> None:
    services.schedules.list_in_slot(_slot(services, s), s)
    services.waker.wake("schedules")


def get_schedule(services: Services, topic: Topic, name: str) -> Schedule:
    found = services.schedules.get(topic.uid, name)
    if found is None:
        raise NotFound(f"No schedule {name!r} on topic {topic.name!r}.")
    return found


def delete_schedule(services: Services, topic: Topic, name: str) -> None:
    """No further fire; the fires produced and not yet handed out are cancelled."""
    s = get_schedule(services, topic, name)
    if not services.schedules.delete(s):
        raise Conflict(f"Schedule {name!r} changed concurrently; retry.")
    services.schedules.unlist(_slot(services, s), s.topic_uid, s.name)
    services.waker.wake("schedules")
    _cancel(services, topic, _pending(services, topic, s.name))


def _pending(services: Services, topic: Topic, name: str) -> list[MessageState]:
    """The schedule's fires produced and not handed out yet (scheduled or paused), by fire
    time."""
    found: list[MessageState] = []
    after, finished = "", False
    while not finished:
        ids, finished = services.campaigns.members_after(topic.uid, fires_index(name), after,
                                                         PAGE)
        found += [r for r in services.messages.get_many(topic.uid, ids).values()
                  if r.state in ("scheduled", "paused")]
        after = ids[-1] if ids else after
    return sorted(found, key=lambda r: _fire_time(r.id))


def _fire_time(message_id: str) -> int:
    return int(message_id.rsplit(":", 1)[1])


def _cancel(services: Services, topic: Topic, rows: list[MessageState]) -> None:
    for row in rows:
        # one handed out meanwhile, or gone, is no longer a pending fire
        with contextlib.suppress(Conflict, NotFound):
            cancel(services, topic, row.id)


def rewrite_fires(services: Services, topic: Topic, old: Schedule, new: Schedule) -> None:
    """Give the pending fires of `old` the content of `new` where their time is still a
    fire of `new` (and their campaign is `new`'s); cancel the others. The releasers make the
    fires of `new` from its next_fire on: one already rewritten here is found with the same
    content (IF NOT EXISTS), so none is made twice."""
    pending = _pending(services, topic, old.name)
    cron = Cron(new.cron, new.timezone)
    keep = [r for r in pending if r.campaign == new.campaign
            and _first_fire(cron, new, _fire_time(r.id)) == _fire_time(r.id)]
    _cancel(services, topic, [r for r in pending if r not in keep])
    if keep:
        _rewrite(services, topic, new, keep)


def _rewrite(services: Services, topic: Topic, s: Schedule, rows: list[MessageState]) -> None:
    now = services.clock()
    changed = []
    for row in rows:
        m = fire_message(s, _fire_time(row.id), topic)
        changed.append(dataclasses.replace(
            row, version=row.version + 1, content_hash=m.content_hash, priority=m.priority,
            deliver_at_ms=m.deliver_at_ms, due_at_ms=placement_ms(m.deliver_at_ms, now),
            requested_at_ms=m.requested_ms, updated_at_ms=now))
    retention = services.config.retention_days
    errors = services.messages.stage(topic.uid, [
        (topic.uid, r.id, r.content_hash, Payload(s.payload, s.encoding, {}),
         ttl_s(r.due_at_ms, now, retention, services.config.horizon_days * MS_PER_DAY))
        for r in changed], [])[0]
    # a fire whose new payload was not written keeps its old content: its row must never
    # name a payload that does not exist
    staged = [r for r, err in zip(changed, errors, strict=True) if err is None]
    if len(staged) < len(changed):
        log.warning("schedule %s: %d waiting fires keep their old content (payload not "
                    "written)", s.name, len(changed) - len(staged))
    placed = place_then(services, topic, staged, now)
    outcomes = services.messages.cas_many([(r, r.version - 1, row_ttl_s(r, now, services.config))
                                           for r in placed], {r.id: r for r in rows})
    finished(services, topic, [r for r, ok in zip(placed, outcomes, strict=True) if ok is True])


def fire_message(s: Schedule, fire_ms: int, topic: Topic | None) -> NewMessage:
    """The message of one fire: the same for every releaser that makes it. Given its topic,
    a fire outside the topic's send window goes to the window's next opening, read in the
    schedule's zone; judged at the fire time itself, not at the releaser's clock, so every
    releaser places it alike."""
    rule = None if topic is None else send_windows.rule(topic, None, s.timezone)
    placed = send_windows.place(rule, fire_ms, fire_ms)
    deliver = placed.deliver_at_ms
    digest = hashlib.sha256(repr((s.payload, s.encoding, s.priority, s.campaign,
                                  deliver)).encode()).hexdigest()[:32]
    # the fire carries the schedule's zone, so its retries, a cap's deferral and a shift
    # place it on the clock it was placed on, not the topic's
    return NewMessage(fire_id(s.name, fire_ms), deliver, s.priority, s.campaign,
                      Payload(s.payload, s.encoding, {}), digest,
                      requested_ms=placed.requested_ms, timezone=s.timezone)


def plan(fires: list[int], now: int, misfire: str) -> list[int]:
    """Which fires to produce now: all that are not misfires (MISFIRE_GRACE_MS late at
    most), and with fire_once the latest misfire, once, for all of them."""
    missed = [f for f in fires if f < now - MISFIRE_GRACE_MS]
    due = [f for f in fires if f >= now - MISFIRE_GRACE_MS]
    return ([missed[-1]] if missed and misfire == "fire_once" else []) + due


def _fires(s: Schedule, now: int, ahead_ms: int) -> tuple[list[int], int | None]:
    """(the fires of s to produce now, its cursor after them)."""
    cron = Cron(s.cron, s.timezone)
    fires: list[int] = []
    fire = _before_end(s, s.next_fire)
    while fire is not None and fire <= now + ahead_ms and len(fires) < MAX_FIRES_PER_PRODUCE:
        fires.append(fire)
        fire = _before_end(s, cron.next_after(fire))
    return plan(fires, now, s.misfire), fire


def produce(services: Services, topic: Topic, due: list[Schedule],
            ahead_ms: int = AHEAD_MS) -> list[Schedule | None]:
    """Produce the fires of these schedules of one topic due within ahead_ms (at least
    AHEAD_MS; the runner gives more when many fires come at once) and their misfires, then
    move their cursors past them: one enqueue for all their fires and one
    conditional batch per ADVANCE_BATCH cursors (a topic's schedules share a partition), so
    a minute of 10,000 schedules costs a few hundred round trips, not 10,000 of each.

    Returns each schedule as it is now: None once deleted; unchanged (its cursor not moved)
    when its fires could not all be written, so the next tick makes them again (IF NOT
    EXISTS: none twice)."""
    now = services.clock()
    planned = [(s, *_fires(s, now, max(ahead_ms, AHEAD_MS))) for s in due]
    failed = _enqueue_fires(services, topic, [(s, fires) for s, fires, _ in planned])
    moving = [(s, next_fire) for s, _, next_fire in planned if s.name not in failed]
    moved = dict(zip((s.name for s, _ in moving), services.schedules.advance_many(moving),
                     strict=True))
    answers: list[Schedule | None] = []
    for s, _, next_fire in planned:
        if s.name in failed:
            log.warning("fires of schedule %s not produced: %s; retried next tick", s.name,
                        failed[s.name])
            answers.append(s)
        elif moved[s.name]:
            answers.append(dataclasses.replace(s, next_fire=next_fire))
        else:
            answers.append(_after_lost_advance(services, topic, s))
    return answers


def _after_lost_advance(services: Services, topic: Topic, s: Schedule) -> Schedule | None:
    """s changed while its fires were made: mend them, return s as it is now."""
    fresh = services.schedules.get(s.topic_uid, s.name)
    if fresh is None:  # deleted while producing: what was just made must not fire
        _cancel(services, topic, _pending(services, topic, s.name))
    elif fresh.version != s.version:  # replaced meanwhile: its fires take the new content
        rewrite_fires(services, topic, s, fresh)
    return fresh


def _enqueue_fires(services: Services, topic: Topic,
                   fires_of: list[tuple[Schedule, list[int]]]) -> dict[str, str]:
    """List, then enqueue, the fires of several schedules at once. Returns the schedules
    (by name) any of whose fires failed, with why."""
    now = services.clock()
    made = [(s.name, fire_message(s, f, topic)) for s, fires in fires_of for f in fires]
    if not made:
        return {}
    failed: dict[str, str] = {}
    errors = services.messages.stage(topic.uid, [], [
        (fires_index(name), m.id or "", ttl_s(m.deliver_at_ms, now,
                                               services.config.retention_days))
        for name, m in made])[1]
    for (name, _), err in zip(made, errors, strict=True):
        if err is not None:
            failed[name] = "not listed"
    todo = [(name, m) for name, m in made if name not in failed]
    results = enqueue(services, topic, [m for _, m in todo])
    for (name, _), result in zip(todo, results, strict=True):
        if result.status >= 500:
            failed[name] = "not written"
    return failed


def next_fire_times(s: Schedule, now: int, count: int = NEXT_FIRE_TIMES) -> list[int]:
    """The next fires from now (within start_at and end_at)."""
    cron = Cron(s.cron, s.timezone)
    times: list[int] = []
    fire = _first_fire(cron, s, now)
    while fire is not None and len(times) < count:
        times.append(fire)
        fire = _before_end(s, cron.next_after(fire))
    return times
