"""Push delivery: due timers → prepare (lease LWT, payload) → armed heap → POST at the due time
→ record the outcome.

Preparing ahead takes the Cassandra round trips (pointer write, LWT) off the delivery path, so
a message is POSTed within milliseconds of its due time, never before it. Each topic has its
own POST thread pool (webhook_concurrency threads) and at most PENDING_PER_TOPIC messages
between take and outcome, so a slow or failing target holds only its own topic's messages;
the dispatcher and the fire loop never wait on a POST. Outcomes are recorded in batches by one
finisher thread.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.messages import RELEASER_PREFIX
from app.models import MessageState, Payload, Pointer, Topic
from app.release import PushOutcome, record_outcomes, take_for_push
from app.scan import PointerKey
from app.services import Services
from workers.timers import Timer, TimerHeap
from workers.webhook import WebhookPoster

FINISH_BATCH = 500
TAKE_CHUNK = 100
TAKERS = 16
PENDING_PER_TOPIC = 5000
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
                 holds: Callable[[int], bool]) -> None:
        self.services = services
        self.consumer = f"{RELEASER_PREFIX}{member}"
        self.timers = timers
        self.topic_of = topic_of
        self.holds = holds
        self.concurrency = services.config.webhook_concurrency
        self.armed: TimerHeap[Armed] = TimerHeap(services.clock)
        self.poster = WebhookPoster(self.concurrency)
        self.rng = random.Random()
        self._waiting: dict[uuid.UUID, deque[Timer]] = defaultdict(deque)
        self._pending: dict[uuid.UUID, int] = defaultdict(int)
        self._pools: dict[uuid.UUID, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._takers = ThreadPoolExecutor(TAKERS, thread_name_prefix="push-taker")
        self.counts = {"prepared": 0, "posted": 0, "recorded": 0}
        self._outcomes: queue.Queue[tuple[Armed, str | None] | None] = queue.Queue()
        self._firing = threading.Event()
        self._firing.set()
        self._threads = [threading.Thread(target=self._fire_loop, name="push-fire", daemon=True),
                         threading.Thread(target=self._finish_loop, name="push-finish",
                                          daemon=True)]
        for t in self._threads:
            t.start()

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
            self._waiting[t.topic_uid].append(t)
        for topic_uid, waiting in list(self._waiting.items()):
            while waiting:
                with self._lock:
                    room = PENDING_PER_TOPIC - self._pending[topic_uid]
                    chunk = [waiting.popleft() for _ in range(min(room, TAKE_CHUNK, len(waiting)))]
                    self._pending[topic_uid] += len(chunk)
                if not chunk:
                    break
                self._takers.submit(self._prepare, topic_uid, chunk)
            if not waiting:
                del self._waiting[topic_uid]

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counts[name] += n

    def _settled(self, topic_uid: uuid.UUID, count: int) -> None:
        with self._lock:
            self._pending[topic_uid] -= count
        self.timers.wake()

    def _prepare(self, topic_uid: uuid.UUID, chunk: list[Timer]) -> None:
        """On a taker thread: lease what this releaser still owns, arm it for its due time."""
        topic = self.topic_of(topic_uid)
        keep = [t for t in chunk if topic is not None and self.holds(t.slot)]
        armed: list[Armed] = []
        try:
            if topic is not None and keep:
                armed = self._take(topic, keep)
        except Exception:  # log and continue; the sweep finds them again
            log.exception("preparing %d messages failed", len(keep))
            if topic is not None:
                self.services.scanner.forget(topic, [t.due.pointer for t in keep])
        finally:
            self._count("prepared", len(armed))
            won = {a.key for a in armed}
            self.timers.done([t.key for t in chunk if t.key not in won])
            self._settled(topic_uid, len(chunk) - len(armed))
        self.armed.add(armed)

    def _take(self, topic: Topic, keep: list[Timer]) -> list[Armed]:
        ahead = self.services.config.release_lookahead_ms
        taken = take_for_push(self.services, topic, [t.due for t in keep], self.consumer, ahead)
        by_id = {t.due.pointer.id: t for t in keep}
        self.services.scanner.spend(topic, [lease_pointer(r) for r, _ in taken])
        return [Armed(by_id[r.id], topic, r, p) for r, p in taken]

    def _fire_loop(self) -> None:
        while self._firing.is_set() or self.armed.waiting():
            for a in self.armed.pop_due():  # ahead 0: never before the due time
                self._pool(a.topic.uid).submit(self._post, a)

    def _pool(self, topic_uid: uuid.UUID) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(topic_uid)
            if pool is None:
                pool = self._pools[topic_uid] = ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix=f"push-{str(topic_uid)[:8]}")
            return pool

    def _post(self, a: Armed) -> None:
        lease_left = (a.row.lease_expires_at_ms or 0) - self.services.clock()
        if lease_left < a.topic.settings.delivery_timeout_seconds * 1000 + POST_START_MARGIN_MS:
            # queued too long behind a slow target: let the lease expire, it comes due again
            log.warning("not posting %s: its lease is about to expire", a.row.id)
            self.services.scanner.forget(a.topic, [lease_pointer(a.row)])
            self._forget([a])
            return
        try:
            error = self.poster.post(a.topic, a.row, a.payload)
        except Exception as exc:  # an outcome, whatever happened
            error = f"{type(exc).__name__}: {exc}"
        self._count("posted", 1)
        self._outcomes.put((a, error))

    def _forget(self, done: list[Armed]) -> None:
        self.armed.done([a.key for a in done])
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
                self.services.scanner.forget(topic, [lease_pointer(r) for r in failed])
            self._count("recorded", len(items))
            self._forget([a for a, _ in items])

    def stats(self) -> dict[str, int]:
        """Totals since start (prepared, posted, recorded) and what is held right now."""
        with self._lock:
            pending = sum(self._pending.values())
            totals = dict(self.counts)
        return {**totals, "armed": self.armed.waiting(), "pending": pending,
                "lead_ms": self.lead_ms()}

    def stop(self) -> None:
        """Graceful stop: prepare nothing new; POST what is armed at its time (at most the
        lead away), finish in-flight POSTs and record their outcomes."""
        self._takers.shutdown(wait=True)
        self._firing.clear()
        self.armed.wake()
        self._threads[0].join()
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.shutdown(wait=True)
        self._outcomes.put(None)
        self._threads[1].join()


def lease_pointer(row: MessageState) -> Pointer:
    """The pointer a push lease wrote at its expiry (version of the leased row)."""
    return Pointer(row.due_at_ms, row.id, row.version, row.priority, row.shard)
