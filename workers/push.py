"""Push delivery: the broker's rounds of a webhook topic (workers.broker) → take at the due
time (lease LWT, payload) → the POST process → POST at once → record the outcome.

Nothing is taken ahead: a message is leased only once it is due and one of its topic's
webhook_concurrency POST slots is free for it (at most that many of a topic between take and
outcome: the room the broker's rounds take up to), so its POST starts at once, and until then
a producer's cancel or move wins. Every POST runs on the event loop of one child process
(workers.post_process). A slow or failing target holds only its own topic's slots; the
broker never waits on a POST. Outcomes are recorded in batches by one finisher thread; one
that cannot be written (no node) is kept and written again every OUTCOME_RETRY_S until it
is, so a POST the target accepted is never POSTed again or made dead for a failed write.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import queue
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.core.timeline import pointer_of
from app.delivery.broker_wire import Taken
from app.delivery.leasing import give_back
from app.delivery.release import PushOutcome, record_outcomes, take_for_push
from app.delivery.scan import Due
from app.messages.by_id import RELEASER_PREFIX
from app.models import MessageState, Payload, Pointer, Topic
from app.ops import metrics
from app.services import Services
from workers.post_process import PostJob, PostProcess, PostResult
from workers.webhook import request_headers

FINISH_BATCH = 500
TAKE_CHUNK = 500
TAKERS = 16
POST_START_MARGIN_MS = 1000  # never start a POST that could outlive the lease
STOP_TAKES_S = 10.0
OUTCOME_RETRY_S = 0.5  # an outcome not written is tried again after this
STOP_OUTCOMES_S = 5.0  # a stopping releaser tries its unwritten outcomes this long
log = logging.getLogger("duetime.releaser")


@dataclasses.dataclass(frozen=True)
class Armed:
    """A message leased for its POST."""

    due: Due  # as the walk read it, before the take
    topic: Topic
    row: MessageState
    payload: Payload | None

    @property
    def due_ms(self) -> int:
        return self.due.pointer.due_at_ms  # the due time of the pointer that made it due

    @property
    def priority(self) -> int:
        return self.row.priority


class PushDispatcher:
    def __init__(self, services: Services, member: str,
                 room_freed: Callable[[uuid.UUID], None],
                 read_again: Callable[[uuid.UUID, list[Pointer]], None]) -> None:
        """room_freed(topic uid): a topic has room again; read_again(topic, pointers): the
        walk passed these pointers (leases that will run out unposted) and must read them
        again."""
        self.services = services
        self.consumer = f"{RELEASER_PREFIX}{member}"
        self.room_freed = room_freed
        self.read_again = read_again
        self.concurrency = services.config.webhook_concurrency
        self.rng = random.Random()
        self._pending: dict[uuid.UUID, int] = defaultdict(int)  # per topic, take to outcome
        self._lock = threading.Lock()
        self._takers = ThreadPoolExecutor(TAKERS, thread_name_prefix="push-taker")
        self._taking = 0  # take() calls under way, waited for by stop()
        self._stopping = False
        self._took = threading.Condition(self._lock)
        self.counts = {"taken": 0, "posted": 0, "recorded": 0}
        self._outcomes: queue.Queue[tuple[Armed, str | None] | None] = queue.Queue()
        # outcomes whose write failed, kept to be written again (the finisher's alone), and
        # their messages' (topic, id, leased version), which no round takes meanwhile
        self._unwritten: list[tuple[Armed, str | None]] = []
        self._settling: set[tuple[uuid.UUID, str, int]] = set()
        self._armed: dict[int, Armed] = {}  # sent to the POST process, result not back
        self._refs = itertools.count()
        self._posts = PostProcess(self._on_results, self._on_lost,
                                  services.config.webhook_allow)
        self._finisher = threading.Thread(target=self._finish_loop, name="push-finish",
                                          daemon=True)
        self._finisher.start()

    def settling(self, row: MessageState) -> bool:
        """Whether this leased row's POST has an outcome not written yet: its lease running
        out is no reason to POST it again."""
        with self._lock:
            return (row.topic_uid, row.id, row.version) in self._settling

    def unwritten_pointers(self) -> list[tuple[uuid.UUID, int, int]]:
        """(topic uid, shard, due ms) of the lease pointer of each outcome not written yet:
        no cursor may pass one, or a releaser that died before writing it would leave the
        message leased for good."""
        with self._lock:
            return [(a.topic.uid, a.row.shard, a.row.due_at_ms) for a, _ in self._unwritten]

    def room(self, topic_uid: uuid.UUID) -> int:
        """How many more of the topic's messages may be taken now: its POST slots
        (webhook_concurrency) not held by a message between take and written outcome."""
        with self._lock:
            return self.concurrency - self._pending.get(topic_uid, 0)

    def take(self, topic: Topic, chunk: list[Due]) -> None:
        """On a broker thread: lease the chunk for its POSTs, TAKE_CHUNK at a time on the
        takers at once, and arm what was leased. A take that failed leaves its pointers
        unspent (the broker's next round tries them again); while stopping, nothing is
        taken."""
        with self._lock:
            if self._stopping:
                return
            self._taking += 1
        try:
            self._take_and_arm(topic, chunk)
        finally:
            with self._lock:
                self._taking -= 1
                self._took.notify_all()

    def _take_and_arm(self, topic: Topic, chunk: list[Due]) -> None:
        stored = self._as_now(topic)
        if stored is None:
            return
        futures = [self._takers.submit(self._take, stored, chunk[i:i + TAKE_CHUNK])
                   for i in range(0, len(chunk), TAKE_CHUNK)]
        armed: list[Armed] = []
        for future, at in zip(futures, range(0, len(chunk), TAKE_CHUNK), strict=True):
            try:
                armed += future.result()
            except Exception:  # log and continue
                piece = chunk[at:at + TAKE_CHUNK]
                log.exception("taking %d messages for their POSTs failed", len(piece))
                self.services.scanner.forget(topic, [d.pointer for d in piece])
        self._count("taken", len(armed))
        with self._lock:
            self._pending[topic.uid] += len(armed)
        if armed:
            self._send(armed)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counts[name] += n

    def _settled(self, topic_uid: uuid.UUID, count: int) -> None:
        with self._lock:
            self._pending[topic_uid] -= count
            if self._pending[topic_uid] <= 0:
                del self._pending[topic_uid]
        self.room_freed(topic_uid)

    def _as_now(self, known: Topic) -> Topic | None:
        """The topic as stored now (None if deleted meanwhile): a message is signed with the
        secrets of when it is taken, so one enqueued after a rotation's answer is signed
        by the new secret, whatever the topic changes the releaser has followed so far."""
        now = self.services.topics.get(known.tenant, known.name)
        return now if now is not None and now.uid == known.uid else None

    def _take(self, topic: Topic, chunk: list[Due]) -> list[Armed]:
        taken = take_for_push(self.services, topic, chunk, self.consumer)
        # a replaced message can be held twice (old and new version): the lease won over
        # version v belongs to v's pointer, whose due time is the one that row carries
        by_version = {(d.row.id, d.row.version): d for d in chunk}
        # the walk passes the lease pointers: each is read again if its POST never ends
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
        per_topic: dict[uuid.UUID, int] = defaultdict(int)
        for a in done:
            per_topic[a.topic.uid] += 1
        for topic_uid, n in per_topic.items():
            self._settled(topic_uid, n)

    def _finish_loop(self) -> None:
        """Record the outcomes as they come, in batches, with those whose write failed
        before (every OUTCOME_RETRY_S while there are any); once stopping, for at most
        STOP_OUTCOMES_S more."""
        stopping, stop_by = False, math.inf
        while not stopping or (self._unwritten and time.monotonic() < stop_by):
            batch, ended = self._gather(OUTCOME_RETRY_S if self._unwritten else None)
            if ended and not stopping:
                stopping, stop_by = True, time.monotonic() + STOP_OUTCOMES_S
            with self._lock:  # they stay listed (their pointers hold the cursors) until written
                again = list(self._unwritten)
            if again or batch:
                self._record(again + batch)
        if self._unwritten:
            log.error("releaser stopped with %d POST outcomes not written; those messages "
                      "come due again when their leases run out", len(self._unwritten))

    def _gather(self, wait_s: float | None) -> tuple[list[tuple[Armed, str | None]], bool]:
        """The outcomes queued, up to FINISH_BATCH, waiting up to wait_s (None: until one
        comes) for the first; and whether stop() asked the finisher to end."""
        try:
            first = self._outcomes.get(timeout=wait_s)
        except queue.Empty:
            return [], False
        batch = [] if first is None else [first]
        ended = first is None
        while len(batch) < FINISH_BATCH and not ended:
            try:
                item = self._outcomes.get_nowait()
            except queue.Empty:
                break
            ended = item is None
            if item is not None:
                batch.append(item)
        return batch, ended

    def _record(self, batch: list[tuple[Armed, str | None]]) -> None:
        """Write the outcomes; one whose write failed is kept (_unwritten) and its message
        is taken by no round until it is written: a POST answered 2xx is never POSTed again
        or made dead because Cassandra did not answer."""
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
            failed = [item for item, r in zip(items, results, strict=True)
                      if isinstance(r, Exception)]
            done = [a for (a, _), r in zip(items, results, strict=True)
                    if not isinstance(r, Exception)]
            with self._lock:
                written = {_settling_key(a) for a in done}
                self._settling.difference_update(written)
                self._unwritten = [item for item in self._unwritten
                                   if _settling_key(item[0]) not in written]
                self._unwritten += [item for item in failed
                                    if _settling_key(item[0]) not in self._settling]
                self._settling.update(_settling_key(a) for a, _ in failed)
            if failed:
                log.warning("could not record %d outcomes of topic %s (%r); kept, written "
                            "again in %.1f s", len(failed), topic.name,
                            next(r for r in results if isinstance(r, Exception)),
                            OUTCOME_RETRY_S)
            self._count("recorded", len(done))
            self._forget(done)

    def stats(self) -> dict[str, int]:
        """Totals since start (taken, posted, recorded) and what is held right now."""
        with self._lock:
            pending = sum(self._pending.values())
            totals = dict(self.counts)
            armed = len(self._armed)
        return {**totals, "armed": armed, "pending": pending}

    def stop(self) -> None:
        """Graceful stop: take nothing new (the takes under way end first, at most
        STOP_TAKES_S); finish in-flight POSTs and record their outcomes (those whose write
        fails, for at most STOP_OUTCOMES_S more)."""
        with self._lock:
            self._stopping = True
            self._took.wait_for(lambda: not self._taking, STOP_TAKES_S)
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
    before = a.due.row
    assert a.payload is not None  # only a message with its payload is sent to be posted
    return Taken(before.attempts, before.consumer, a.row, a.payload,
                 a.row.lease_expires_at_ms or a.due_ms)


def _settling_key(a: Armed) -> tuple[uuid.UUID, str, int]:
    return (a.row.topic_uid, a.row.id, a.row.version)


def lease_pointer(row: MessageState) -> Pointer:
    """The pointer a push lease wrote at its expiry (version of the leased row)."""
    return pointer_of(row)
