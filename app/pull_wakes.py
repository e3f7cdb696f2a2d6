"""Wake-ups for long polls: a process that writes a pointer of a pull topic due soon tells the
releasers serving long polls (workers.broker), so a want parked there with nothing due need
not re-read the timeline every few milliseconds to be on time.

A releaser listens on a UDP socket and registers its address in `pull_listeners` every
HEARTBEAT_S (TTL_S). A process that writes pointers of a pull topic due within the wake
horizon (app.placement.pull_wake_ms) sends every registered process the topic's uid,
coalesced as app.wakeups does for the releasers; the addresses are read at most every
ADDRESSES_EVERY_MS and only while there is something to send. A process that creates,
changes or deletes a topic tells them TOPICS, and their topic caches follow the change at
once (app.topic_cache).

A parked want looks again after the idle period (DUETIME_PULL_IDLE_MS) without a wake-up.
That is on time only while every writer knows where to wake: ready() says so from
READY_AFTER_S after the first registration (every sender has read the addresses again by
then) for as long as the registration is renewed. A wake-up is a hint, never the record: a
lost one delays a message by at most the idle period, never loses it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from app import metrics
from app.config import Config
from app.errors import DuetimeError
from app.store.pull_listeners import PullListenerStore
from app.wakeups import ADDRESSES_EVERY_MS, DatagramListener, Waker, decode

PREFIX = b"duetime-pull "
TOPICS = "topics"  # not a topic uid: a topic was created, changed or deleted
HEARTBEAT_S = 10
TTL_S = 30
READY_AFTER_S = 2 * ADDRESSES_EVERY_MS / 1000
log = logging.getLogger(__name__)


class PullWakes:
    """Thread-safe; one per process. tell() never blocks on the network or Cassandra."""

    def __init__(self, config: Config, store: PullListenerStore,
                 on_wake: Callable[[uuid.UUID], None],
                 on_topics: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.store = store
        self.on_wake = on_wake
        self.on_topics = on_topics
        self._sender = Waker(self._others, PREFIX, label="pull")
        self._lock = threading.Lock()
        self._listener: DatagramListener | None = None
        self._started = False
        self._registered_at: float | None = None  # monotonic s of the first registration
        self._renewed_at = float("-inf")  # monotonic s of the latest
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    @property
    def address(self) -> str | None:
        return None if self._listener is None else self._listener.address

    def start(self) -> None:
        """Listen and register (in the background); once per process, later calls are
        free. A socket that cannot be bound leaves this process never ready."""
        if self._started:
            return
        with self._lock:
            if self._started:
                return
            self._started = True
            try:
                # any free port: the processes of one host (gunicorn's workers) need one each
                self._listener = DatagramListener(self.config.replace(wake_port=0),
                                                  self._handle, "pull-wakes")
            except OSError as exc:
                log.warning("long polls will not rest: no wake-up socket (%s)", exc)
                return
            self._listener.start()
            self._heartbeat_thread = threading.Thread(target=self._heartbeat,
                                                      name="pull-wakes-heartbeat", daemon=True)
            self._heartbeat_thread.start()

    def ready(self) -> bool:
        """May a topic rest: every writer knows where to wake this process?"""
        with self._lock:
            first, latest = self._registered_at, self._renewed_at
        now = time.monotonic()
        return (first is not None and now - first >= READY_AFTER_S
                and now - latest < TTL_S - HEARTBEAT_S)

    def tell(self, topic_uid: uuid.UUID) -> None:
        """Tell the other processes serving long polls that a pointer of this topic due soon
        was written (after the write)."""
        self._sender.wake(str(topic_uid))

    def tell_topics(self) -> None:
        """Tell the other processes serving long polls that a topic changed (after the
        write of its change)."""
        self._sender.wake(TOPICS)

    def _others(self) -> list[str]:
        own = self.address
        return [a for a in self.store.addresses() if a != own]

    def _handle(self, datagram: bytes) -> None:
        for text in decode(datagram, PREFIX, known=None):
            if text == TOPICS:
                self.on_topics()
                continue
            try:
                topic_uid = uuid.UUID(text)
            except ValueError:
                continue
            metrics.WAKEUPS_RECEIVED.labels("pull").inc()
            self.on_wake(topic_uid)

    def _heartbeat(self) -> None:
        address = self.address
        assert address is not None
        while not self._stop.is_set():
            try:
                self.store.register(address, TTL_S)
                now = time.monotonic()
                with self._lock:
                    self._registered_at = self._registered_at or now
                    self._renewed_at = now
            except DuetimeError as exc:  # not ready once the last registration is too old
                log.debug("pull listener not registered: %s", exc)
            self._stop.wait(HEARTBEAT_S)

    def close(self) -> None:
        self._stop.set()
        self._sender.close()
        if self._listener is not None:
            self._listener.close()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=5)
