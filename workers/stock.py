"""Messages a broker leased ahead for the next lease calls of a busy pull topic: handed out
from memory, with no Cassandra request on the call's path (docs/design.md, "How a due
message is found", **Stock**).

A stocked message is leased on one set of terms (lease seconds, consumer name) and goes only
to a want asking those terms. Its row's hand-out moment (`updated_at`) is its deadline here:
until then a cancel answers 409 ("being delivered"), and it is handed out only before that
deadline less HAND_MARGIN_MS; past it the broker gives it back (due again now, its attempt
not counted). Thread-safe.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

from app.delivery.broker_wire import Taken
from app.models import Topic

Terms = tuple[int, str | None]  # (lease seconds, consumer name)
# a stocked message is handed out at least this long (ms) before its deadline, so that its
# answer reaches the call while a cancel still answers 409
HAND_MARGIN_MS = 200


class Stock:
    """Per (topic, terms), the messages leased ahead in fair order, each with its deadline
    (monotonic s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[uuid.UUID, Terms], list[tuple[float, Taken]]] = defaultdict(list)
        self._filled: dict[tuple[uuid.UUID, Terms], int] = {}
        self._topics: dict[uuid.UUID, Topic] = {}  # of the stocked messages, to give back

    def put(self, topic: Topic, terms: Terms, taken: list[Taken],
            deadline_s: float, filled_ms: int) -> None:
        """Keep what a round leased ahead at filled_ms (epoch ms: it was ranked against
        what the broker held then)."""
        with self._lock:
            self._kept[(topic.uid, terms)].extend((deadline_s, t) for t in taken)
            self._filled[(topic.uid, terms)] = filled_ms
            self._topics[topic.uid] = topic

    def head(self, topic_uid: uuid.UUID, terms: Terms) -> tuple[Taken, int] | None:
        """The next message stocked on these terms and when the stock was last filled."""
        with self._lock:
            kept = self._kept.get((topic_uid, terms))
            return (kept[0][1], self._filled[(topic_uid, terms)]) if kept else None

    def count(self, topic_uid: uuid.UUID, terms: Terms) -> int:
        with self._lock:
            return len(self._kept.get((topic_uid, terms), ()))

    def take(self, topic_uid: uuid.UUID, terms: Terms, n: int,
             usable: Callable[[Taken], bool]) -> tuple[list[Taken], list[Taken]]:
        """Up to n messages of the topic stocked on these terms, first in, that `usable`
        accepts and whose deadline is not near; and those it passed over (to give back)."""
        now_s = time.monotonic() + HAND_MARGIN_MS / 1000
        got: list[Taken] = []
        passed: list[Taken] = []
        with self._lock:
            kept = self._kept.get((topic_uid, terms))
            while kept and len(got) < n:
                deadline_s, t = kept.pop(0)
                (got if deadline_s > now_s and usable(t) else passed).append(t)
            if kept is not None and not kept:
                self._forget((topic_uid, terms))
        return got, passed

    def expired(self) -> list[tuple[Topic, list[Taken]]]:
        """Take out every message whose deadline is near, by topic."""
        now_s = time.monotonic() + HAND_MARGIN_MS / 1000
        gone: dict[uuid.UUID, list[Taken]] = defaultdict(list)
        with self._lock:
            topics = dict(self._topics)
            for (uid, terms), kept in list(self._kept.items()):
                left = [(d, t) for d, t in kept if d > now_s]
                gone[uid] += [t for d, t in kept if d <= now_s]
                if left:
                    self._kept[(uid, terms)] = left
                else:
                    self._forget((uid, terms))
        return [(topics[uid], taken) for uid, taken in gone.items() if taken]

    def drop(self, topic_uid: uuid.UUID) -> list[Taken]:
        """Take out every message stocked of the topic (deleted)."""
        dropped: list[Taken] = []
        with self._lock:
            for key in [key for key in self._kept if key[0] == topic_uid]:
                dropped += [t for _, t in self._kept[key]]
                self._forget(key)
        return dropped

    def _forget(self, key: tuple[uuid.UUID, Terms]) -> None:
        self._kept.pop(key, None)
        self._filled.pop(key, None)
        if not any(uid == key[0] for uid, _ in self._kept):
            self._topics.pop(key[0], None)
