"""Push delivery: due timers → prepare (lease LWT, payload) → armed in the POST process → POST
at the due time → record the outcome.

Preparing ahead takes the Cassandra round trips (pointer write, LWT) off the delivery path, so
a message is POSTed within milliseconds of its due time, never before it. Every POST runs on
the event loop of one child process (workers.post_process): a timer per armed message fires at
its due time, then the POST waits for one of its topic's webhook_concurrency slots (lowest
priority value first). With at most PENDING_PER_TOPIC messages of a topic between take and
outcome, a slow or failing target holds only its own topic's messages; the dispatcher and the
takers never wait on a POST. Outcomes are recorded in batches by one finisher thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.core.timeline import pointer_of
from app.delivery.broker_wire import Taken
from app.delivery.fairness import FairQueue
from app.delivery.leasing import give_back
from app.delivery.release import PushOutcome, record_outcomes, take_for_push
from app.delivery.scan import PointerKey, pointer_key
from app.messages.by_id import RELEASER_PREFIX
from app.models import MessageState, Payload, Pointer, Topic
from app.ops import metrics
from app.services import Services
from workers.post_process import PostJob, PostProcess, PostResult
from workers.timers import Timer, TimerHeap
from workers.webhook import request_headers

FINISH_BATCH = 500
TAKE_CHUNK = 500
TAKERS = 16
PENDING_PER_TOPIC = 20_000
POST_START_MARGIN_MS = 1000  # never start a POST that could outlive the lease
log = logging.getLogger("duetime.releaser")


@dataclasses.dataclass(frozen=True)
class Armed:
    """A message leased for its POST, waiting for its due time."""

    timer: Timer
    topic: Topic
    row: MessageState
    payload: Payload | None

    @property
    def key(self) -> PointerKey:
        return self.timer.key

    @property
    def due_ms(self) -> int:
        return self.timer.due_ms  # the due time of the pointer that made it due

    @property
    def priority(self) -> int:
        return self.row.priority


class PushDispatcher:
    def __init__(self, services: Services, member: str, timers: TimerHeap[Timer],
                 topic_of: Callable[[uuid.UUID], Topic | None],
                 may_prepare: Callable[[int], bool],
                 read_again: Callable[[uuid.UUID, list[Pointer]], None]) -> None:
        """may_prepare(slot): may a message of that release slot be leased for its POST
        (workers.ownership.SlotOwnership.may_prepare); read_again(topic, pointers): the
        walk passed these pointers, whose take failed, and must read them again."""
        self.services = services
        self.consumer = f"{RELEASER_PREFIX}{member}"
        self.timers = timers
        self.topic_of = topic_of
        self.may_prepare = may_prepare
        self.read_again = read_again
        self.concurrency = services.config.webhook_concurrency
        self.rng = random.Random()
        # per topic, due timers waiting for room among its PENDING_PER_TOPIC (groups take turns)
        self._waiting: dict[uuid.UUID, FairQueue[Timer]] = defaultdict(FairQueue)
        self._pending: dict[uuid.UUID, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._takers = ThreadPoolExecutor(TAKERS, thread_name_prefix="push-taker")
        self.counts = {"prepared": 0, "posted": 0, "recorded": 0}
        self._outcomes: queue.Queue[tuple[Armed, str | None] | None] = queue.Queue()
        self._armed: dict[int, Armed] = {}  # sent to the POST process, result not back
        self._refs = itertools.count()
        self._posts = PostProcess(self._on_results, self._on_lost,
                                  services.config.webhook_allow)
        self._finisher = threading.Thread(target=self._finish_loop, name="push-finish",
                                          daemon=True)
        self._finisher.start()

    def lead_ms(self) -> int:
        """How long before its due time a message is prepared: the base lead, plus the time
        the timers already waiting take to prepare at release_prepare_rate (a burst is
        prepared early enough), at most the look-ahead window."""
        cfg = self.services.config
        backlog_ms = 1000 * self.timers.waiting() // cfg.release_prepare_rate
        return min(cfg.release_prepare_ms + backlog_ms,
                   cfg.release_lookahead_ms - 2 * cfg.release_rescan_ms)

    def submit(self, due: list[Timer]) -> None:
        """Queue due timers per topic, then prepare what each topic's room allows."""
        for t in due:
            row = t.due.row
            self._waiting[t.topic_uid].push(t, row.fair_group, row.priority, t.due_ms)
        for topic_uid, waiting in list(self._waiting.items()):
            while waiting:
                with self._lock:
                    room = PENDING_PER_TOPIC - self._pending[topic_uid]
                    chunk = [waiting.pop() for _ in range(min(room, TAKE_CHUNK, len(waiting)))]
                    self._pending[topic_uid] += len(chunk)
                if not chunk:
                    break
                self._takers.submit(self._prepare, topic_uid, chunk)
            if not waiting:
                del self._waiting[topic_uid]

    def has_waiting(self) -> bool:
        """Are timers submitted and not yet prepared (waiting for their topic's room)?
        Called by the submitting thread."""
        return bool(self._waiting)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counts[name] += n

    def _settled(self, topic_uid: uuid.UUID, count: int) -> None:
        with self._lock:
            self._pending[topic_uid] -= count
        self.timers.wake()

    def _prepare(self, topic_uid: uuid.UUID, chunk: list[Timer]) -> None:
        """On a taker thread: lease what this releaser still may (its slots, and those it
        handed back a moment ago), arm it for its due time. The walk reads again what it
        passed and nothing took: timers of a slot whose lease this releaser could not
        confirm in time (its renewals slow: a node down), and takes that failed or were
        left undecided (a lease pointer or an LWT not written)."""
        topic = self.topic_of(topic_uid)
        keep = [t for t in chunk if topic is not None and self.may_prepare(t.slot)]
        kept = {t.key for t in keep}
        again = [t.due.pointer for t in chunk if topic is not None and t.key not in kept]
        armed: list[Armed] = []
        try:
            stored = self._as_now(topic) if keep else None
            if stored is not None:
                armed = self._take(stored, keep)
                spent = self.services.scanner.spent
                again += [t.due.pointer for t in keep
                          if pointer_key(topic_uid, t.due.pointer.id, t.due.pointer.version)
                          not in spent]
        except Exception:  # log and continue
            log.exception("preparing %d messages failed", len(keep))
            if topic is not None:
                self.services.scanner.forget(topic, [t.due.pointer for t in keep])
                again += [t.due.pointer for t in keep]
        finally:
            self._count("prepared", len(armed))
            won = {a.key for a in armed}
            self.timers.done([t.key for t in chunk if t.key not in won])
            self._settled(topic_uid, len(chunk) - len(armed))
        if again:  # once their timers are done: the walk skips a pointer a timer holds
            self.read_again(topic_uid, again)
        if armed:
            self._send(armed)

    def _as_now(self, known: Topic | None) -> Topic | None:
        """The topic as stored now (None if deleted meanwhile): a message is signed with the
        secrets of when it is prepared, so one enqueued after a rotation's answer is signed
        by the new secret, whatever the topic changes the releaser has followed so far."""
        if known is None:
            return None
        now = self.services.topics.get(known.tenant, known.name)
        return now if now is not None and now.uid == known.uid else None

    def _take(self, topic: Topic, keep: list[Timer]) -> list[Armed]:
        ahead = self.services.config.release_lookahead_ms
        taken = take_for_push(self.services, topic, [t.due for t in keep], self.consumer, ahead)
        # a replaced message can have two timers (old and new version): the lease won over
        # version v belongs to v's timer, whose due time is the one that row carries
        by_version = {(t.due.row.id, t.due.row.version): t for t in keep}
        self.services.scanner.spend(topic, [lease_pointer(r) for r, _ in taken])
        return [Armed(by_version[(r.id, r.version - 1)], topic, r, p) for r, p in taken]

    def _send(self, armed: list[Armed]) -> None:
        """Hand armed messages to the POST process (a missing payload is a failed POST)."""
        jobs: list[PostJob] = []
        now = self.services.clock()
        with self._lock:
            for a in armed:
                if a.payload is None:
                    self._outcomes.put((a, "payload missing"))
                    continue
                ref = next(self._refs)
                self._armed[ref] = a
                jobs.append(post_job(ref, a, self.concurrency, now))
        if jobs:
            self._posts.send(jobs)

    def _on_results(self, results: list[PostResult]) -> None:
        """On the POST process's reader thread: outcomes to record, or skipped POSTs (queued
        behind a slow target until their lease nearly ran out) to let come due again."""
        with self._lock:
            done = [(a, r) for r in results if (a := self._armed.pop(r.ref, None)) is not None]
        skipped = [a for a, r in done if not r.posted]
        for a, r in done:
            if r.posted:
                self._outcomes.put((a, r.error))
                metrics.WEBHOOK_ATTEMPTS.labels(metrics.webhook_outcome(r.error)).inc()
        by_topic: dict[uuid.UUID, list[int]] = {}
        for a, r in done:
            if r.posted:
                by_topic.setdefault(a.topic.uid, []).append(r.started_ms - a.due_ms)
        for topic_uid, lags in by_topic.items():
            self.services.lag.observe(topic_uid, "push", lags)
        self._count("posted", len(done) - len(skipped))
        if skipped:
            log.warning("not posting %d messages: their leases were about to expire; each is "
                        "given back, due when its lease would have ended", len(skipped))
            self._not_posted(skipped)

    def _not_posted(self, armed: list[Armed]) -> None:
        """POSTs never started (queued behind their topic's slots until their lease nearly
        ran out): given back on a taker thread (_give_back); while stopping, their leases
        run out instead."""
        try:
            self._takers.submit(self._give_back, armed)
        except RuntimeError:  # the takers are shut down: the releaser stops
            self._drop(armed)

    def _give_back(self, armed: list[Armed]) -> None:
        """Each message scheduled again, due when its lease would have ended, its attempt not
        counted: nothing was sent, so a topic's queue behind a slow target never uses up a
        message's max_attempts (app.delivery.leasing.give_back). One the give-back could not
        move (changed meanwhile, or its write failed) stays leased and comes due at its
        lease's end, as before."""
        by_topic: dict[uuid.UUID, list[Armed]] = defaultdict(list)
        for a in armed:
            by_topic[a.topic.uid].append(a)
        for items in by_topic.values():
            given = {r.id for r in give_back(self.services, items[0].topic,
                                             [_taken(a) for a in items])}
            self._drop([a for a in items if a.row.id not in given])
            self._forget([a for a in items if a.row.id in given])

    def _on_lost(self, refs: list[int]) -> None:
        """The POST process died holding these: their leases expire and they come due again."""
        with self._lock:
            lost = [self._armed.pop(ref) for ref in refs if ref in self._armed]
        self._drop(lost)

    def _drop(self, armed: list[Armed]) -> None:
        for a in armed:
            self._read_lease_again(a.topic, [a.row])
        self._forget(armed)

    def _read_lease_again(self, topic: Topic, rows: list[MessageState]) -> None:
        """Leases that will run out unposted (or unrecorded): their lease pointers, taken
        for spent when leased, are not any more, and the walk reads them again (it may
        have passed them while they were), so each comes due again at its lease's end."""
        pointers = [lease_pointer(r) for r in rows]
        self.services.scanner.forget(topic, pointers)
        self.read_again(topic.uid, pointers)

    def _forget(self, done: list[Armed]) -> None:
        self.timers.done([a.key for a in done])
        per_topic: dict[uuid.UUID, int] = defaultdict(int)
        for a in done:
            per_topic[a.topic.uid] += 1
        for topic_uid, n in per_topic.items():
            self._settled(topic_uid, n)

    def _finish_loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._outcomes.get()
            batch = [] if first is None else [first]
            stopping = first is None
            while len(batch) < FINISH_BATCH and not stopping:
                try:
                    item = self._outcomes.get_nowait()
                except queue.Empty:
                    break
                stopping = item is None
                if item is not None:
                    batch.append(item)
            if batch:
                self._record(batch)

    def _record(self, batch: list[tuple[Armed, str | None]]) -> None:
        per_topic: dict[uuid.UUID, list[tuple[Armed, str | None]]] = defaultdict(list)
        for item in batch:
            per_topic[item[0].topic.uid].append(item)
        for items in per_topic.values():
            topic = items[0][0].topic
            try:
                results: list[bool | Exception] = record_outcomes(
                    self.services, topic, [PushOutcome(a.row, e) for a, e in items], self.rng)
            except Exception as exc:  # log and continue
                results = [exc] * len(items)
            failed = [a.row for (a, _), r in zip(items, results, strict=True)
                      if isinstance(r, Exception)]
            if failed:
                log.warning("could not record %d outcomes of topic %s; the leases will expire "
                            "and the messages come due again", len(failed), topic.name)
                self._read_lease_again(topic, failed)
            self._count("recorded", len(items))
            self._forget([a for a, _ in items])

    def stats(self) -> dict[str, int]:
        """Totals since start (prepared, posted, recorded) and what is held right now."""
        with self._lock:
            pending = sum(self._pending.values())
            totals = dict(self.counts)
            armed = len(self._armed)
        return {**totals, "armed": armed, "pending": pending,
                "lead_ms": self.lead_ms()}

    def stop(self) -> None:
        """Graceful stop: prepare nothing new; POST what is armed at its time (at most the
        lead away), finish in-flight POSTs and record their outcomes."""
        self._takers.shutdown(wait=True)
        self._posts.stop()
        self._outcomes.put(None)
        self._finisher.join()


def post_job(ref: int, a: Armed, concurrency: int, now_ms: int) -> PostJob:
    """What the POST process needs to send one armed message (payload present), signed for
    when it goes out: its due time, or now_ms (epoch ms) when that is later."""
    assert a.payload is not None
    settings = a.topic.settings
    timeout_ms = settings.delivery_timeout_seconds * 1000
    return PostJob(
        ref=ref, topic=str(a.topic.uid), concurrency=concurrency, due_ms=a.due_ms,
        start_by_ms=int((a.row.lease_expires_at_ms or 0) - timeout_ms - POST_START_MARGIN_MS),
        priority=a.priority, group=a.row.fair_group, url=settings.delivery_url or "",
        headers=request_headers(a.topic, a.row, a.payload, max(now_ms, a.due_ms)),
        body=a.payload.data,
        timeout_s=settings.delivery_timeout_seconds)


def _taken(a: Armed) -> Taken:
    """An armed message as a give-back takes it: the row before and as leased; due again
    when its lease ends."""
    before = a.timer.due.row
    assert a.payload is not None  # only a message with its payload is sent to be posted
    return Taken(before.attempts, before.consumer, a.row, a.payload,
                 a.row.lease_expires_at_ms or a.due_ms)


def lease_pointer(row: MessageState) -> Pointer:
    """The pointer a push lease wrote at its expiry (version of the leased row)."""
    return pointer_of(row)
