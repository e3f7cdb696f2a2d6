"""Group commit of one-message requests (enqueue, ack): requests of one process for one
topic that arrive while one of that kind is being written share the next write.

Most HTTP producers and consumers handle one message per request, and an enqueue or an ack
costs the same handful of Cassandra requests whether it carries one message or a hundred.
So at most one group of a kind runs per topic at a time in a process: a request that finds
none running runs at once, alone (an idle API adds no wait); one that finds one running
joins the next group, which its first member runs as soon as the running one ends, for
everyone in it (up to MAX_GROUP messages). Each request gets its own answer, exactly as the
batch call gives it for that item, which is the answer it would have had alone (a repeated
enqueue id is 200 or 409, as in two requests; see enqueue_groups and ack_groups); a failure
of the shared write fails each member with the same error (503 for Cassandra), never one
member for another's bad input (each request validates its own before it joins).
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from app.delivery.leasing import ack_many
from app.errors import DuetimeError
from app.messages.enqueue import EnqueueResult, NewMessage, enqueue
from app.models import Topic
from app.services import Services

MAX_GROUP = 100
Item = TypeVar("Item")
Result = TypeVar("Result")


class _Group(Generic[Item, Result]):
    def __init__(self, topic: Topic) -> None:
        self.topic = topic
        self.items: list[Item] = []
        self.results: list[Result] = []
        self.error: BaseException | None = None
        self.start = threading.Event()  # the runner may go: the one before it ended
        self.done = threading.Event()


class GroupCommit(Generic[Item, Result]):
    """Thread-safe; one per kind and process. `batch(topic, items)` answers each item in
    order, as the one-item call would."""

    def __init__(self, batch: Callable[[Topic, list[Item]], list[Result]]) -> None:
        self.batch = batch
        self._lock = threading.Lock()
        self._running: set[uuid.UUID] = set()
        # per topic, the groups waiting for the running one to end, in arrival order; only
        # the last takes new members
        self._waiting: dict[uuid.UUID, deque[_Group[Item, Result]]] = {}

    def submit(self, topic: Topic, item: Item) -> Result:
        """batch(topic, [item])[0], sharing the write with concurrent requests."""
        uid = topic.uid
        with self._lock:
            if uid not in self._running:
                self._running.add(uid)
                group: _Group[Item, Result] = _Group(topic)
                index, runner = 0, True
                group.items.append(item)
                group.start.set()
            else:
                queue = self._waiting.setdefault(uid, deque())
                runner = not queue or len(queue[-1].items) >= MAX_GROUP
                if runner:
                    queue.append(_Group(topic))
                group = queue[-1]
                index = len(group.items)
                group.items.append(item)
        if runner:
            group.start.wait()
            self._run(group)
        else:
            group.done.wait()
        if group.error is not None:
            raise group.error
        return group.results[index]

    def waiting(self) -> int:
        """Messages waiting for their group's turn, all topics."""
        with self._lock:
            return sum(len(g.items) for queue in self._waiting.values() for g in queue)

    def _run(self, group: _Group[Item, Result]) -> None:
        try:
            group.results = self.batch(group.topic, group.items)
        except BaseException as exc:  # every member answers it, as each would have alone
            group.error = exc
        finally:
            group.done.set()
            uid = group.topic.uid
            with self._lock:
                queue = self._waiting.get(uid)
                following = queue.popleft() if queue else None
                if not queue:
                    self._waiting.pop(uid, None)
                if following is None:
                    self._running.discard(uid)
            if following is not None:
                following.start.set()  # its members are fixed: later ones queue behind it


def enqueue_groups(services: Services) -> GroupCommit[NewMessage, EnqueueResult]:
    """One-message enqueues, grouped: app.messages.enqueue.enqueue answers a repeated id inside a
    batch from its first occurrence, 200 or 409, as two requests would be answered, and puts
    the group in its process's shared home of the topic, as each alone would be."""
    return GroupCommit(lambda topic, items: enqueue(services, topic, items, small_requests=True))


def ack_groups(services: Services
               ) -> GroupCommit[tuple[str, str], DuetimeError | None]:
    """One-message acks, grouped. The same (id, token) twice in a group is acked once and
    both answered alike (a second ack with the token that acked is a no-op)."""
    def batch(topic: Topic, pairs: list[tuple[str, str]]) -> list[DuetimeError | None]:
        unique = list(dict.fromkeys(pairs))
        answers = dict(zip(unique, ack_many(services, topic, unique), strict=True))
        return [answers[p] for p in pairs]

    return GroupCommit(batch)
