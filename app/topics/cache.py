"""The topics an API process looked up for message requests, kept so that one enqueue, lease
or ack does not cost a topic read. Safe because it follows the changes other processes write
to topic_changes (the releasers follow the same table, workers.topics):

- a follower thread reads the recent changes every FOLLOW_EVERY_MS and drops every entry a
  change may postdate, so another process's put or delete reaches this cache within about
  FOLLOW_EVERY_MS plus a write's latency; this process's own put or delete drops its entry at
  once (TopicCache.forget);
- an entry is trusted only while the follower has read the changes in the last TRUST_MS and
  for at most MAX_AGE_MS (a change whose topic_changes row was never written, the writer
  dying in between, is picked up then); otherwise the topic is read as before;
- the follower reads only while lookups come at least as often as it reads (the last
  FOLLOW_MIN within BUSY_SPAN_MS, the latest within that too); otherwise it stops, the cache
  empties and every lookup reads the topic: a worker pool long-polling quiet topics looks a
  topic up every few seconds, and following for it cost ten reads a second per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from app.models import Topic
from app.store.topics import TopicStore

FOLLOW_EVERY_MS = 100
TRUST_MS = 1000
MAX_AGE_MS = 10_000
BUSY_SPAN_MS = 1000
FOLLOW_MIN = BUSY_SPAN_MS // FOLLOW_EVERY_MS  # lookups within the span worth following for
# A change row is written after its topic row, its id timed by Cassandra's clock, so a
# lookup that began after that time read the new topic: an entry is dropped by a change
# up to CLOCK_MARGIN_MS older than the entry (this clock may be behind Cassandra's; /readyz
# fails past the safety lag). Each read looks back LOOK_BACK_MS for changes written late.
CLOCK_MARGIN_MS = 1000
LOOK_BACK_MS = 10_000
log = logging.getLogger("duetime.topics")


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TopicCache:
    """Thread-safe. get() reads through; the follower thread starts on first use."""

    def __init__(self, store: TopicStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[Topic | None, int, int]] = {}
        self._followed_at = -TRUST_MS  # monotonic ms of the last successful changes read
        self._lookups: deque[int] = deque(maxlen=FOLLOW_MIN)  # monotonic ms of the latest
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def get(self, tenant: str, name: str) -> Topic | None:
        """The topic (None: there is none), from the cache while it can be trusted."""
        now = _monotonic_ms()
        with self._lock:
            self._lookups.append(now)
            busy = self._busy(now)
        if busy:
            self._start()
        key = (tenant, name)
        with self._lock:
            entry = self._entries.get(key)
            trusted = now - self._followed_at <= TRUST_MS
        if entry is not None and trusted and now - entry[1] <= MAX_AGE_MS:
            return entry[0]
        fetched_wall = time.time_ns() // 1_000_000
        topic = self.store.get(tenant, name)
        if trusted:
            with self._lock:
                self._entries[key] = (topic, now, fetched_wall)
        return topic

    def forget(self, tenant: str, name: str) -> None:
        """This process changed the topic: its next lookup reads it."""
        with self._lock:
            self._entries.pop((tenant, name), None)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _busy(self, now: int) -> bool:
        """Whether lookups come often enough to follow for (the caller holds the lock)."""
        lookups = self._lookups
        return (len(lookups) == FOLLOW_MIN and lookups[-1] - lookups[0] <= BUSY_SPAN_MS
                and now - lookups[-1] <= BUSY_SPAN_MS)

    def _start(self) -> None:
        if self._thread is not None and self._wake.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._follow, name="topic-cache",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def _follow(self) -> None:
        while not self._closed:
            with self._lock:
                idle = not self._busy(_monotonic_ms())
                if idle:
                    self._entries.clear()
                    self._followed_at = -TRUST_MS
                    self._wake.clear()
            if idle:
                self._wake.wait()  # until the next lookup
                continue
            started = _monotonic_ms()
            try:
                self._drop_changed(time.time_ns() // 1_000_000)
            except Exception as exc:  # untrusted until a read succeeds; lookups read through
                log.debug("following topic changes failed: %r", exc)
            time.sleep(max(0, FOLLOW_EVERY_MS - (_monotonic_ms() - started)) / 1000)

    def _drop_changed(self, wall_ms: int) -> None:
        started = _monotonic_ms()
        changes = self.store.changes_since(wall_ms - LOOK_BACK_MS)
        with self._lock:
            for changed, tenant, name in changes:
                entry = self._entries.get((tenant, name))
                changed_ms = self.store.change_ms(changed)
                if entry is not None and changed_ms >= entry[2] - CLOCK_MARGIN_MS:
                    del self._entries[(tenant, name)]
            # entries fetched before this read began are covered by it from now on
            self._followed_at = started
