"""The workload of a fault run, and the history it records (every call with its outcome and
times on this host's clock, epoch ms), which tests/faults/checker.py judges.

Per round, one pull topic and one webhook topic:
- producers enqueue messages under client ids (a retry after a lost answer is the same
  message), one a request, due over the round's window with a burst of a fifth of them due
  at one moment, each sent SENT_AHEAD_MS before it is due (traffic runs through the whole
  window); PRODUCERS threads share the plan, so a slow answer holds back its own message and
  not those after it (the checker counts any enqueue answered after its message was due);
- a tenth are cancelled and a tenth moved 2 s later, while still scheduled, by the same
  threads at their moment;
- pull consumers long-poll and ack; one nacks a message's first attempt now and then, and one
  never acks a tenth of what it gets (its lease expires and the message comes back);
- the webhook target answers 500 to a tenth of first attempts (the message is retried).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import requests

from app.core.timeparse import parse_instant
from tests.receiver import Receiver

LEASE_SECONDS = 3  # a lease the "never acks" consumer drops comes back this soon
RETRY_BACKOFF_S = 1
HOOK_TIMEOUT_S = 5  # the webhook topic's POST timeout
BURST_SHARE = 0.2
SENT_AHEAD_MS = 5000  # each message is enqueued this long before it is due
PRODUCERS = 16  # one message a request: 400 of a burst within SENT_AHEAD_MS at ~100 ms each
MOVE_DELAY_MS = 2000  # a move asks for delivery this long after it is sent
STATE_READ_S = 30  # how long a state read asks again while the API answers 503
ENQUEUE_PATIENCE_S = 60  # how long a producer sends a message again: past a node's restart


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass
class Event:
    """One call: what was asked, how it ended (status, or 0 when no answer came), when."""

    kind: str  # enqueue, cancel, move, handout (a lease or a POST received), ack, nack
    topic: str
    id: str
    sent_ms: int
    done_ms: int
    status: int = 0
    deliver_at_ms: int = 0  # enqueue and move: the time asked; handout: the time it carried
    detail: str = ""


class History:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def of_all(self) -> list[Event]:
        with self._lock:
            return list(self.events)


def _fails_first(message_id: str, before: int) -> int:
    """The webhook target's answer: 500 to the first arrival of a tenth of the ids."""
    return 500 if before == 0 and zlib.crc32(message_id.encode()) % 10 == 0 else 200


def new_receiver() -> Receiver:
    return Receiver(script=_fails_first)


class Workload:
    """One round against the stack at `url` with `key`; run() returns when its producers and
    its cancels and moves are done, drain() when every message is settled or time is up."""

    def __init__(self, url: str, key: str, history: History, target: Receiver, label: str,
                 messages: int, window_ms: int) -> None:
        self.url = f"{url}/v1/topics"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.history = history
        self.target = target
        self.label = label
        self.messages = messages
        self.window_ms = window_ms
        self.pull = f"{label}-pull"
        self.hook = f"{label}-hook"
        self._stop_consumers = threading.Event()
        self._consumers: list[threading.Thread] = []
        self.random = random.Random(zlib.crc32(label.encode()))
        # the producers' plan: (moment epoch ms, order, kind, topic, id, due epoch ms)
        self._tasks: list[tuple[int, int, str, str, str, int]] = []
        self._order = itertools.count()
        self._tasks_changed = threading.Condition()
        self._in_hand = 0

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              session: requests.Session | None = None, timeout: float = 10,
              ) -> tuple[int, dict[str, Any] | None]:
        """(status, JSON body); (0, None) when no answer came (a killed worker, a timeout)."""
        try:
            answer = (session or requests).request(method, f"{self.url}/{path}",
                                                   headers=self.headers, json=body,
                                                   timeout=timeout)
        except requests.RequestException:
            return 0, None
        try:
            return answer.status_code, answer.json()
        except ValueError:
            return answer.status_code, None

    def create_topics(self, target_url: str) -> None:
        retry = {"backoff_seconds": RETRY_BACKOFF_S, "max_backoff_seconds": RETRY_BACKOFF_S}
        for name, delivery in ((self.pull, {"mode": "pull"}),
                               (self.hook, {"mode": "webhook", "url": target_url,
                                            "timeout_seconds": HOOK_TIMEOUT_S})):
            status, body = self._call("PUT", name, {"lease_seconds": LEASE_SECONDS,
                                                    "retry": retry, "delivery": delivery})
            assert status in (200, 201), (status, body)

    def start_consumers(self) -> None:
        behaviours: list[Callable[[dict[str, Any]], str]] = [
            lambda m: "ack", lambda m: "ack",
            lambda m: "nack" if m["attempt"] == 1 and self.random.random() < 0.1 else "ack",
            lambda m: "drop" if self.random.random() < 0.1 else "ack"]
        for n, behaviour in enumerate(behaviours):
            thread = threading.Thread(target=self._consume, args=(f"c{n}", behaviour),
                                      name=f"consumer-{n}", daemon=True)
            thread.start()
            self._consumers.append(thread)

    def _consume(self, name: str, behaviour: Callable[[dict[str, Any]], str]) -> None:
        session = requests.Session()
        while not self._stop_consumers.is_set():
            sent = now_ms()
            status, body = self._call("POST", f"{self.pull}/leases", {
                "max": 10, "wait_ms": 1000, "consumer": name}, session, timeout=15)
            if status != 200 or body is None:
                time.sleep(0.2)
                continue
            received = now_ms()
            for m in body["messages"]:
                self.history.add(Event("handout", self.pull, m["id"], sent, received, 200,
                                       _ms(m["deliver_at"]), f"{name} attempt {m['attempt']}"))
            for m in body["messages"]:
                self._settle(m, behaviour(m), session)

    def _settle(self, m: dict[str, Any], action: str, session: requests.Session) -> None:
        if action == "drop":
            return
        sent = now_ms()
        status, _ = self._call("POST", f"{self.pull}/messages/{m['id']}/{action}",
                               {"lease_token": m["lease"]["token"]}, session)
        self.history.add(Event(action, self.pull, m["id"], sent, now_ms(), status))

    def run(self) -> None:
        """Enqueue every message, each SENT_AHEAD_MS before it is due, and cancel or move some
        (those still more than 1.5 s from due when enqueued) at a moment drawn before they
        are due; PRODUCERS threads take the plan's tasks in time order. Returns when every
        task is done."""
        start = now_ms() + SENT_AHEAD_MS
        burst_at = start + self.random.randrange(self.window_ms)
        for n in range(self.messages):
            topic = self.pull if n % 2 == 0 else self.hook
            due = burst_at if self.random.random() < BURST_SHARE else \
                start + self.random.randrange(self.window_ms)
            self._plan(due - SENT_AHEAD_MS, "enqueue", topic, f"{self.label}-m{n}", due)
        producers = [threading.Thread(target=self._produce, daemon=True)
                     for _ in range(PRODUCERS)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()

    def _plan(self, at_ms: int, kind: str, topic: str, message_id: str, due: int = 0) -> None:
        with self._tasks_changed:
            heapq.heappush(self._tasks, (at_ms, next(self._order), kind, topic, message_id, due))
            self._tasks_changed.notify()

    def _next_task(self) -> tuple[int, int, str, str, str, int] | None:
        """The earliest task once its moment comes; None when none is left or in hand (a
        task in hand may plan another: an enqueue its cancel or move)."""
        with self._tasks_changed:
            while True:
                if not self._tasks and not self._in_hand:
                    self._tasks_changed.notify_all()
                    return None
                wait_ms = self._tasks[0][0] - now_ms() if self._tasks else 50
                if wait_ms <= 0:
                    self._in_hand += 1
                    return heapq.heappop(self._tasks)
                self._tasks_changed.wait(min(wait_ms, 50) / 1000)

    def _produce(self) -> None:
        session = requests.Session()
        while (task := self._next_task()) is not None:
            _, _, kind, topic, message_id, due = task
            try:
                if kind == "enqueue":
                    self._enqueue(session, topic, message_id, due)
                    roll = self.random.random()
                    if roll < 0.2 and due - now_ms() > 1500:
                        self._plan(self.random.randrange(now_ms(), due - 1000),
                                   "cancel" if roll < 0.1 else "move", topic, message_id)
                else:
                    self._change(session, kind, topic, message_id)
            finally:
                with self._tasks_changed:
                    self._in_hand -= 1
                    self._tasks_changed.notify_all()

    def _enqueue(self, session: requests.Session, topic: str, message_id: str,
                 due: int) -> None:
        """Send until an answer comes (same id, same content: an idempotent retry), for up to
        ENQUEUE_PATIENCE_S, as a producer following a 503's retry hint would."""
        body = {"id": message_id, "deliver_at": _iso(due), "payload": {"id": message_id}}
        deadline = time.monotonic() + ENQUEUE_PATIENCE_S
        while True:
            sent = now_ms()
            status, _ = self._call("POST", f"{topic}/messages", body, session)
            self.history.add(Event("enqueue", topic, message_id, sent, now_ms(), status, due))
            if 200 <= status < 500 or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def _change(self, session: requests.Session, kind: str, topic: str,
                message_id: str) -> None:
        sent = now_ms()
        if kind == "cancel":
            status, _ = self._call("DELETE", f"{topic}/messages/{message_id}", session=session)
            self.history.add(Event("cancel", topic, message_id, sent, now_ms(), status))
        else:
            status, body = self._call("PATCH", f"{topic}/messages/{message_id}",
                                      {"delay_ms": MOVE_DELAY_MS}, session)
            moved = _ms(body["deliver_at"]) if status == 200 and body else 0
            self.history.add(Event("move", topic, message_id, sent, now_ms(), status, moved))

    def record_arrivals(self, history: History) -> None:
        """Add the webhook target's arrivals of this round's topic to history, as handouts;
        one the target answered 200 is also the delivery (an ack)."""
        seen: dict[str, int] = {}
        for a in list(self.target.arrivals):
            if not a.message_id.startswith(f"{self.label}-"):
                continue
            before = seen.get(a.message_id, 0)
            seen[a.message_id] = before + 1
            deliver_at = a.headers.get("Duetime-Deliver-At")
            history.add(Event("handout", self.hook, a.message_id, a.received_ms,
                              a.received_ms, 200, _ms(deliver_at) if deliver_at else 0,
                              f"webhook attempt {a.headers.get('Duetime-Attempt', '?')}"))
            # a 200 written after the POST's timeout never reached duetime, which had given
            # up on that attempt: not a delivery it knew of (the target held its answer)
            answered_ms = a.answered_ms or a.received_ms
            if (a.answered and _fails_first(a.message_id, before) == 200
                    and answered_ms - a.received_ms < HOOK_TIMEOUT_S * 1000):
                history.add(Event("ack", self.hook, a.message_id, answered_ms,
                                  answered_ms, 204))

    def state_of(self, message_id: str, patience_s: float = STATE_READ_S
                 ) -> dict[str, Any] | None:
        """What the API says of a message now (to explain a lost one). A 503 or no answer is
        not a state: like a client following the retry hint, it asks again, for up to
        patience_s (after a node restart one API worker may reconnect a second after
        another)."""
        topic = self.pull if int(message_id.rsplit("-m", 1)[1]) % 2 == 0 else self.hook
        deadline = time.monotonic() + patience_s
        while True:
            status, body = self._call("GET", f"{topic}/messages/{message_id}")
            if (status != 0 and status < 500) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {"status": status, **{k: (body or {}).get(k) for k in (
            "state", "attempts", "deliver_at", "updated_at", "last_error")}}

    def stop_consumers(self) -> None:
        self._stop_consumers.set()
        for thread in self._consumers:
            thread.join(20)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _ms(text: str) -> int:
    return int(parse_instant(text))
