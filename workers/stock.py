"""Messages a broker leased ahead for the next lease calls of a busy pull topic: handed out
from memory, with no Cassandra request on the call's path (docs/design.md, "Pull leases,
step by step", **The stock**), and the rules of when a round fills the stock and when the
stock may serve one.

A stocked message is leased on one set of terms (lease seconds, consumer name) and goes only
to a want asking those terms. Its row's hand-out moment (`updated_at`) is its deadline here:
until then a cancel answers 409 ("being delivered"), and it is handed out only before that
deadline less HAND_MARGIN_MS; past it the broker gives it back (due again now, its attempt
not counted). Thread-safe; no Cassandra request and no caller's predicate runs under its
lock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

from app.delivery.broker_wire import Taken
from app.models import Topic

Terms = tuple[int, str | None]  # (lease seconds, consumer name)
# While more than BACKLOG messages of a topic are due and held beyond what a round's wants
# ask, a round for a want of at most WANT_MAX messages whose terms were asked within
# DEMAND_S before also leases up to SIZE more on those terms; one not handed out within
# AGE_MS (its deadline) goes back.
SIZE = 16
WANT_MAX = 4
BACKLOG = 64
DEMAND_S = 1.0
AGE_MS = 1000
# a stocked message is handed out at least this long (ms) before its deadline, so that its
# answer reaches the call while a cancel still answers 409
HAND_MARGIN_MS = 200
MAX_ASKED = 100_000  # (topic, terms) asks remembered; forgotten all at once beyond


class Stock:
    """Per (topic, terms), the messages leased ahead in fair order, each with its deadline
    (monotonic s); and when each (topic, terms) was last asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[uuid.UUID, Terms], list[tuple[float, Taken]]] = defaultdict(list)
        self._filled: dict[tuple[uuid.UUID, Terms], int] = {}
        self._topics: dict[uuid.UUID, Topic] = {}  # of the stocked messages, to give back
        self._asked_at: dict[tuple[uuid.UUID, Terms], float] = {}  # monotonic s

    def asked(self, topic_uid: uuid.UUID, terms: Sequence[Terms]) -> set[Terms]:
        """Of the terms a round serves, those asked within DEMAND_S before (a pool calling
        again and again, which a stock serves); records this ask."""
        now_s = time.monotonic()
        repeated = set()
        with self._lock:
            if len(self._asked_at) > MAX_ASKED:
                self._asked_at.clear()
            for t in terms:
                if now_s - self._asked_at.get((topic_uid, t), -DEMAND_S) < DEMAND_S:
                    repeated.add(t)
                self._asked_at[(topic_uid, t)] = now_s
        return repeated

    @staticmethod
    def looks_beyond(first_n: int) -> int:
        """How many held and due messages beyond its wants a round reads, its first want
        asking first_n: enough to see whether it may stock."""
        return BACKLOG + SIZE if first_n <= WANT_MAX else 0

    def room(self, topic_uid: uuid.UUID, first_n: int, terms: Terms, repeated: set[Terms],
             backlog: int, written_ms: int, now_ms: int) -> int:
        """How many a round leases ahead on its first want's terms: none unless that want
        asks at most WANT_MAX, its terms were asked again, more than BACKLOG due messages
        wait beyond the wants and no write of the topic was noted (written_ms, epoch ms)
        within AGE_MS (while producers write it, a stock would mostly go back unused:
        serves); else up to SIZE in stock."""
        if (first_n > WANT_MAX or terms not in repeated or backlog <= BACKLOG
                or now_ms - written_ms < AGE_MS):
            return 0
        return max(0, min(SIZE - self.count(topic_uid, terms), backlog - BACKLOG))

    def serves(self, topic_uid: uuid.UUID, terms: Terms, written_ms: int,
               first_due_priority: Callable[[], int | None]) -> bool:
        """Whether the stock may serve a round whose first want asks these terms: they are
        stocked, no write of the topic was noted (written_ms: a want's own process's, or a
        due wake-up: it may rank first, and a round reads it) since the stock was filled,
        and no message held and due now (first_due_priority, asked last) has a higher
        priority than the stock's next."""
        found = self.head(topic_uid, terms)
        if found is None or written_ms >= found[1]:
            return False
        ahead = first_due_priority()
        return ahead is None or ahead >= found[0].leased.priority

    def put(self, topic: Topic, terms: Terms, taken: list[Taken],
            deadline_s: float, filled_ms: int) -> None:
        """Keep what a round leased ahead at filled_ms (epoch ms: it was ranked against
        what the broker held then)."""
        with self._lock:
            self._kept[(topic.uid, terms)].extend((deadline_s, t) for t in taken)
            self._filled[(topic.uid, terms)] = filled_ms
            self._topics[topic.uid] = topic

    def count(self, topic_uid: uuid.UUID, terms: Terms) -> int:
        with self._lock:
            return len(self._kept.get((topic_uid, terms), ()))

    def head(self, topic_uid: uuid.UUID, terms: Terms) -> tuple[Taken, int] | None:
        """The next message stocked on these terms and when the stock was last filled."""
        with self._lock:
            kept = self._kept.get((topic_uid, terms))
            return (kept[0][1], self._filled[(topic_uid, terms)]) if kept else None

    def take(self, topic_uid: uuid.UUID, terms: Terms, n: int,
             usable: Callable[[Taken], bool]) -> tuple[list[Taken], list[Taken]]:
        """Up to n messages of the topic stocked on these terms, first in, whose deadline is
        not near and that `usable` accepts (asked with the lock let go: it may read); and
        those taken out but passed over (to give back)."""
        got: list[Taken] = []
        passed: list[Taken] = []
        while len(got) < n:
            near_s = time.monotonic() + HAND_MARGIN_MS / 1000
            fresh: list[Taken] = []
            with self._lock:
                kept = self._kept.get((topic_uid, terms))
                while kept and len(fresh) < n - len(got):
                    deadline_s, t = kept.pop(0)
                    (fresh if deadline_s > near_s else passed).append(t)
                if kept is not None and not kept:
                    self._forget((topic_uid, terms))
            if not fresh:
                break
            for t in fresh:
                (got if usable(t) else passed).append(t)
        return got, passed

    def expired(self) -> list[tuple[Topic, list[Taken]]]:
        """Take out every message whose deadline is near, by topic."""
        near_s = time.monotonic() + HAND_MARGIN_MS / 1000
        return self._take_out(lambda deadline_s: deadline_s <= near_s)

    def take_all(self) -> list[tuple[Topic, list[Taken]]]:
        """Take out every message stocked, by topic (the broker stops)."""
        return self._take_out(lambda _: True)

    def drop(self, topic_uid: uuid.UUID) -> list[Taken]:
        """Take out every message stocked of the topic (deleted)."""
        dropped: list[Taken] = []
        with self._lock:
            for key in [key for key in self._kept if key[0] == topic_uid]:
                dropped += [t for _, t in self._kept[key]]
                self._forget(key)
        return dropped

    def _take_out(self, gone: Callable[[float], bool]) -> list[tuple[Topic, list[Taken]]]:
        out: dict[uuid.UUID, list[Taken]] = defaultdict(list)
        with self._lock:
            topics = dict(self._topics)
            for (uid, terms), kept in list(self._kept.items()):
                left = [(d, t) for d, t in kept if not gone(d)]
                out[uid] += [t for d, t in kept if gone(d)]
                if left:
                    self._kept[(uid, terms)] = left
                else:
                    self._forget((uid, terms))
        return [(topics[uid], taken) for uid, taken in out.items() if taken]

    def _forget(self, key: tuple[uuid.UUID, Terms]) -> None:
        self._kept.pop(key, None)
        self._filled.pop(key, None)
        if not any(uid == key[0] for uid, _ in self._kept):
            self._topics.pop(key[0], None)
