"""Push delivery: due timers → lease (LWT) → POST on the topic's own threads → record outcome.

Each topic has its own thread pool of webhook_concurrency threads and never has more than that
many messages taken and not yet answered, so a slow or failing target holds only its own
topic's messages; the dispatcher never waits on a POST. Outcomes are recorded in batches by
one finisher thread.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.models import MessageState, Payload, Pointer, Topic
from app.release import PushOutcome, record_outcomes, take_for_push
from app.services import Services
from workers.timers import DueTimers, Timer
from workers.webhook import WebhookPoster

FINISH_BATCH = 500
log = logging.getLogger("duetime.releaser")


class PushDispatcher:
    def __init__(self, services: Services, member: str, timers: DueTimers,
                 topic_of: Callable[[uuid.UUID], Topic | None],
                 holds: Callable[[int], bool]) -> None:
        self.services = services
        self.consumer = f"releaser:{member}"
        self.timers = timers
        self.topic_of = topic_of
        self.holds = holds
        self.concurrency = services.config.webhook_concurrency
        self.poster = WebhookPoster()
        self.rng = random.Random()
        self._waiting: dict[uuid.UUID, deque[Timer]] = defaultdict(deque)
        self._inflight: dict[uuid.UUID, int] = defaultdict(int)
        self._pools: dict[uuid.UUID, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._outcomes: queue.Queue[tuple[Topic, Timer, PushOutcome] | None] = queue.Queue()
        self._finisher = threading.Thread(target=self._finish_loop, name="push-finisher",
                                          daemon=True)
        self._finisher.start()

    def submit(self, due: list[Timer]) -> None:
        """Queue due timers per topic, then start what each topic's free capacity allows."""
        for t in due:
            self._waiting[t.topic_uid].append(t)
        for topic_uid, waiting in list(self._waiting.items()):
            with self._lock:
                room = self.concurrency - self._inflight[topic_uid]
            chunk = [waiting.popleft() for _ in range(min(room, len(waiting)))]
            if chunk:
                self._start(topic_uid, chunk)
            if not waiting:
                del self._waiting[topic_uid]

    def _start(self, topic_uid: uuid.UUID, chunk: list[Timer]) -> None:
        topic = self.topic_of(topic_uid)
        keep = [t for t in chunk if topic is not None and self.holds(t.slot)]
        self.timers.done([t.key for t in chunk if t not in keep])
        if topic is None or not keep:
            return
        try:
            taken = take_for_push(self.services, topic, [t.due for t in keep], self.consumer)
        except Exception:  # log and continue; the sweep finds them again
            log.exception("taking %d messages of topic %s failed", len(keep), topic.name)
            self.services.scanner.forget(topic, [t.due.pointer for t in keep])
            self.timers.done([t.key for t in keep])
            return
        by_id = {t.due.pointer.id: t for t in keep}
        self.timers.done([t.key for t in keep if t.due.pointer.id not in
                          {r.id for r, _ in taken}])
        self.services.scanner.spend(topic, [_lease_pointer(r) for r, _ in taken])
        with self._lock:
            self._inflight[topic_uid] += len(taken)
        pool = self._pool(topic_uid)
        for row, payload in taken:
            pool.submit(self._post, topic, by_id[row.id], row, payload)

    def _pool(self, topic_uid: uuid.UUID) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(topic_uid)
            if pool is None:
                pool = self._pools[topic_uid] = ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix=f"push-{str(topic_uid)[:8]}")
            return pool

    def _post(self, topic: Topic, timer: Timer, row: MessageState,
              payload: Payload | None) -> None:
        try:
            error = self.poster.post(topic, row, payload)
        except Exception as exc:  # an outcome, whatever happened
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._inflight[topic.uid] -= 1
        self._outcomes.put((topic, timer, PushOutcome(row, error)))
        self.timers.wake()

    def _finish_loop(self) -> None:
        while True:
            first = self._outcomes.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < FINISH_BATCH:
                try:
                    item = self._outcomes.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._record(batch)
                    return
                batch.append(item)
            self._record(batch)

    def _record(self, batch: list[tuple[Topic, Timer, PushOutcome]]) -> None:
        per_topic: dict[uuid.UUID, list[tuple[Topic, Timer, PushOutcome]]] = defaultdict(list)
        for item in batch:
            per_topic[item[0].uid].append(item)
        for items in per_topic.values():
            topic = items[0][0]
            try:
                results: list[bool | Exception] = record_outcomes(
                    self.services, topic, [o for _, _, o in items], self.rng)
            except Exception as exc:  # log and continue
                results = [exc] * len(items)
            failed = [o.row for (_, _, o), r in zip(items, results, strict=True)
                      if isinstance(r, Exception)]
            if failed:
                log.warning("could not record %d outcomes of topic %s; the leases will expire "
                            "and the messages come due again", len(failed), topic.name)
                self.services.scanner.forget(topic, [_lease_pointer(r) for r in failed])
            self.timers.done([t.key for _, t, _ in items])

    def stop(self) -> None:
        """Finish in-flight POSTs and record their outcomes; take nothing new."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.shutdown(wait=True)
        self._outcomes.put(None)
        self._finisher.join()


def _lease_pointer(row: MessageState) -> Pointer:
    """The pointer a push lease wrote at its expiry (version of the leased row)."""
    return Pointer(row.due_at_ms, row.id, row.version, row.priority, row.shard)
