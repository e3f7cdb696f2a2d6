"""Pull leases taken ahead: a long-polling call is handed a message at its due moment, not a
poll interval and a lease round trip after it.

A lease pass for waiting calls also leases messages due within DUETIME_PULL_AHEAD_MS, on the
terms of a call that will still be waiting then, the lease running from the message's due
time (app.leasing.take, as the releasers' push does). Until its due time such a message is
held here, in this process. From its due time on it is handed to a waiting call with the
same terms, after one read has checked that the lease is still the one taken: a cancel or a
reschedule meanwhile wins, and the message is dropped, never handed out. A message no call
has taken give_back_after_ms (DUETIME_PULL_GIVE_BACK_MS) after its due time (its call was
answered by others, or gave up) is given back: scheduled again at once, the attempt not
counted. A process that closes (an API worker that gunicorn stops) gives back all it holds;
one that dies holding messages leaves them leased, and they come due again when the lease
expires (at least once, late by the lease).
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
    """A message leased ahead: its due time before the lease (never handed out before it),
    the row before and after the lease, its payload and the terms of the lease."""

    due_ms: int
    before: MessageState
    leased: MessageState
    payload: Payload
    terms: Hashable


GiveBack = Callable[[Topic, list[HeldLease]], None]


class HeldLeases:
    """Messages this process leased ahead, per topic, earliest due first. Thread-safe. A
    thread of its own gives back what no call took in time (give_back, a callback)."""

    def __init__(self, clock: Callable[[], int], give_back: GiveBack,
                 give_back_after_ms: int = GIVE_BACK_AFTER_MS) -> None:
        self.clock = clock
        self.give_back = give_back
        self.give_back_after_ms = give_back_after_ms
        self._held: dict[uuid.UUID, list[tuple[int, int, HeldLease]]] = {}
        self._topics: dict[uuid.UUID, Topic] = {}
        self._offered: set[int] = set()  # sequence numbers of due ones no call could take
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def hold(self, topic: Topic, items: list[HeldLease]) -> None:
        """Hold messages just leased ahead until their due time."""
        self._push(topic, items, offered=False)

    def count(self, topic_uid: uuid.UUID) -> int:
        with self._changed:
            return len(self._held.get(topic_uid, ()))

    def next_due_ms(self, topic_uid: uuid.UUID) -> int | None:
        """The due time of the earliest held message no call has been offered yet."""
        with self._changed:
            return min((due for due, seq, _ in self._held.get(topic_uid, ())
                        if seq not in self._offered), default=None)

    def take_due(self, topic_uid: uuid.UUID, now_ms: int, limit: int) -> list[HeldLease]:
        """Up to limit held messages due by now_ms, earliest first, no longer held."""
        with self._changed:
            return self._pop(topic_uid, now_ms, limit)

    def put_back(self, topic: Topic, items: list[HeldLease], offered: bool = True) -> None:
        """Hold again due messages no waiting call could take (other terms): they wake no
        call until a new one arrives (offered), and are given back in time if none takes
        them."""
        self._push(topic, items, offered)

    def _push(self, topic: Topic, items: list[HeldLease], offered: bool) -> None:
        if not items:
            return
        with self._changed:
            heap = self._held.setdefault(topic.uid, [])
            self._topics[topic.uid] = topic
            for item in items:
                seq = next(self._seq)
                if offered:
                    self._offered.add(seq)
                heapq.heappush(heap, (item.due_ms, seq, item))
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
            _, seq, item = heapq.heappop(heap)
            self._offered.discard(seq)
            out.append(item)
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

