"""Leases a releaser took for this process that no call has taken yet (app.desk): the
surplus of a want made for several calls, or an answer that came after its call left.

Each is held here, in this process, for the next call on the same terms (lease seconds and
consumer), from its due time on, after one read has checked that the lease is still the one
taken: a cancel or a reschedule meanwhile wins, and the message is dropped, never handed
out. One no call has taken give_back_after_ms (DUETIME_PULL_GIVE_BACK_MS) after its due time
(or after it was held, for a backlog's) is given back: scheduled again at once, the attempt
not counted. A process that closes (an API worker that gunicorn stops) gives back all it
holds; one that dies holding messages leaves them leased, and they come due again when the
lease expires (at least once, late by the lease).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import threading
import uuid
from collections.abc import Callable, Hashable

from app.models import MessageState, Payload, Topic

# The default of DUETIME_PULL_GIVE_BACK_MS: a consumer that acks and asks again is back well
# within this, even on a busy host (at 50 ms, a fifth of what was held at 200 msgs/s went
# back and forth).
GIVE_BACK_AFTER_MS = 250
log = logging.getLogger("duetime.pull_ahead")


@dataclasses.dataclass(frozen=True)
class HeldLease:
    """A message leased for a call: its due time before the lease (never handed out before it),
    the row before and after the lease, its payload and the terms of the lease."""

    due_ms: int
    before: MessageState
    leased: MessageState
    payload: Payload
    terms: Hashable


GiveBack = Callable[[Topic, list[HeldLease]], None]


class HeldLeases:
    """Messages leased for this process and not yet handed out, per topic, earliest due
    first. Thread-safe. A
    thread of its own gives back what no call took in time (give_back, a callback)."""

    def __init__(self, clock: Callable[[], int], give_back: GiveBack,
                 give_back_after_ms: int = GIVE_BACK_AFTER_MS) -> None:
        self.clock = clock
        self.give_back = give_back
        self.give_back_after_ms = give_back_after_ms
        self._held: dict[uuid.UUID, list[tuple[int, int, HeldLease]]] = {}
        self._topics: dict[uuid.UUID, Topic] = {}
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def hold(self, topic: Topic, items: list[HeldLease]) -> None:
        """Hold messages a releaser leased for this process until a call takes them."""
        self._push(topic, items)

    def take_due(self, topic_uid: uuid.UUID, now_ms: int, limit: int,
                 terms: Hashable) -> list[HeldLease]:
        """Up to limit held messages on these terms due by now_ms, earliest first, no longer
        held (those on other terms stay)."""
        with self._changed:
            heap = self._held.get(topic_uid, [])
            due = sorted(entry for entry in heap if entry[0] <= now_ms)
            mine = [entry for entry in due if entry[2].terms == terms][:limit]
            if mine:
                taken = {seq for _, seq, _ in mine}
                heap[:] = [entry for entry in heap if entry[1] not in taken]
                heapq.heapify(heap)
                if not heap:
                    del self._held[topic_uid]
                    self._topics.pop(topic_uid, None)
            return [item for _, _, item in mine]

    def put_back(self, topic: Topic, items: list[HeldLease]) -> None:
        """Hold again messages a call could not hand out (a read failed)."""
        self._push(topic, items)

    def _push(self, topic: Topic, items: list[HeldLease]) -> None:
        if not items:
            return
        with self._changed:
            heap = self._held.setdefault(topic.uid, [])
            self._topics[topic.uid] = topic
            for item in items:
                heapq.heappush(heap, (item.due_ms, next(self._seq), item))
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._return_loop,
                                                name="pull-ahead-returner", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def close(self) -> None:
        """Stop the returner and give back everything still held."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        self._give_back_all(math.inf)

    def _pop(self, topic_uid: uuid.UUID, until_ms: float, limit: float) -> list[HeldLease]:
        """(Holding the lock.) Up to limit held messages of a topic due by until_ms,
        earliest first, no longer held."""
        heap = self._held.get(topic_uid, [])
        out: list[HeldLease] = []
        while heap and heap[0][0] <= until_ms and len(out) < limit:
            out.append(heapq.heappop(heap)[2])
        if not heap and topic_uid in self._held:
            del self._held[topic_uid]
            self._topics.pop(topic_uid, None)
        return out

    def _give_back_all(self, until_ms: float) -> None:
        """Give back every held message due by until_ms."""
        with self._changed:
            found = [(self._topics[uid], self._pop(uid, until_ms, math.inf))
                     for uid in list(self._held)]
        for topic, items in found:
            if not items:
                continue
            try:
                self.give_back(topic, items)
            except Exception:  # their leases expire instead: late, never lost
                log.warning("could not give back %d messages leased ahead", len(items),
                            exc_info=True)

    def _return_loop(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                earliest = min((heap[0][0] for heap in self._held.values() if heap),
                               default=None)
                now = self.clock()
                after = self.give_back_after_ms
                if earliest is None or earliest + after > now:
                    wait_ms = 1000 if earliest is None else earliest + after - now
                    self._changed.wait(wait_ms / 1000)
                    continue
            self._give_back_all(self.clock() - self.give_back_after_ms)

