"""Wake-ups: a process that writes something a releaser must act on soon tells the releasers
with one UDP datagram, so releasers need not poll Cassandra every few milliseconds to be on
time, and an idle stack makes almost no requests.

What wakes what (KINDS):
- "due:<topic uid>" (due_kind): pointers of that topic due within the look-ahead were
  written; the releasers' walk reads that topic at once (it reads every topic at least every
  second, and otherwise steps every DUETIME_RELEASE_IDLE_MS), and their brokers serve the
  long polls parked on it (workers.broker). A bare "due" (from a process older than the
  named kind) has the walk look at every topic at once.
- "topics": a topic was created, changed or deleted; the releasers follow the change at once.
- "schedules": a schedule's listing changed; the releasers read the listings' marks.
- "operations": a campaign operation was enlisted; a releaser claims it at once.
- "slots": a releaser handed release slots back (rebalance, stop); the others claim their
  share at once (workers.ownership), not at their next ownership tick.

A wake is a hint, never the record: the write it follows is in Cassandra first, and every
releaser still polls at an idle period, so a lost datagram costs a delay of at most that
period, never a message. Wakes of a process are coalesced: the sender thread sends what came
in during the last COALESCE_MS in one datagram per releaser, always after the writes that
asked for it. The releasers' addresses come from their membership rows (releaser_members),
read again at most every ADDRESSES_EVERY_MS and only while there is something to send: an
idle process reads and sends nothing.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable

from app.config import Config
from app.errors import DuetimeError
from app.ops import metrics

KINDS = frozenset({"due", "topics", "schedules", "operations", "slots"})
DUE = "due:"
PREFIX = b"duetime-wake "
COALESCE_MS = 2
ADDRESSES_EVERY_MS = 2000
DATAGRAM_MAX = 1200  # bytes: within any path's MTU, so no datagram is fragmented
log = logging.getLogger(__name__)

Addresses = Callable[[], list[str]]
Wake = Callable[[str], None]  # Waker.wake, as the stores and the placer take it


def no_wake(kind: str) -> None:
    """A Wake that tells no releaser (stores built outside Services, test doubles)."""


def due_kind(topic_uid: uuid.UUID) -> str:
    """The kind that has the walk read a topic written to."""
    return f"{DUE}{topic_uid}"


def named_topic(kind: str, prefix: str) -> uuid.UUID | None:
    """The topic a named kind of this prefix (DUE) names; None for any other kind."""
    if not kind.startswith(prefix):
        return None
    try:
        return uuid.UUID(kind[len(prefix):])
    except ValueError:
        return None


def encode(kinds: set[str], prefix: bytes = PREFIX) -> list[bytes]:
    """The datagrams that carry these kinds (more than one when they do not fit in
    DATAGRAM_MAX bytes)."""
    datagrams: list[bytes] = []
    body = b""
    for kind in sorted(kinds):
        item = kind.encode()
        if body and len(prefix) + len(body) + 1 + len(item) > DATAGRAM_MAX:
            datagrams.append(prefix + body)
            body = b""
        body = body + b"," + item if body else item
    return [*datagrams, prefix + body]


def decode(datagram: bytes, prefix: bytes = PREFIX,
           known: frozenset[str] | None = KINDS) -> set[str]:
    """The kinds a datagram asks for (with `known`, only those and the kinds naming a
    topic; foreign datagrams: none)."""
    if not datagram.startswith(prefix):
        return set()
    return {k for k in datagram[len(prefix):].decode("ascii", "replace").split(",")
            if k and (known is None or k in known or named_topic(k, DUE) is not None)}


def parse_address(address: str) -> tuple[str, int] | None:
    """("host", port) of a "host:port" membership value; None when malformed."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def advertised_host(config: Config) -> str:
    """DUETIME_WAKE_HOST, else this host's name resolved (a pod's IP), else loopback."""
    if config.wake_host:
        return config.wake_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Waker:
    """Thread-safe; one per process. wake() never blocks on the network or Cassandra."""

    def __init__(self, addresses: Addresses, prefix: bytes = PREFIX) -> None:
        self._addresses = addresses
        self._prefix = prefix
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._signal = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._known: list[tuple[str, int]] = []
        self._known_at = -ADDRESSES_EVERY_MS / 1000
        self._socket: socket.socket | None = None

    def wake(self, kind: str) -> None:
        """Ask the releasers to run the step of `kind` soon (after this call's writes)."""
        with self._lock:
            if self._closed:
                return
            self._pending.add(kind)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="waker", daemon=True)
                self._thread.start()
        self._signal.set()

    def refresh_addresses(self) -> None:
        """Read the releasers' addresses again before the next send: a releaser that just
        joined is not among those read up to ADDRESSES_EVERY_MS ago."""
        with self._lock:
            self._known_at = -math.inf

    def _run(self) -> None:
        while True:
            self._signal.wait()
            time.sleep(COALESCE_MS / 1000)  # wakes of the next moments go in one datagram
            self._signal.clear()
            with self._lock:
                kinds, self._pending = self._pending, set()
                closed = self._closed
            if kinds:
                self._send(kinds)
            if closed:
                return

    def _send(self, kinds: set[str]) -> None:
        now = time.monotonic()
        with self._lock:
            known_at = self._known_at
        if now - known_at >= ADDRESSES_EVERY_MS / 1000:
            try:
                self._known = [a for a in map(parse_address, self._addresses()) if a]
                self._known_at = now
            except DuetimeError as exc:  # keep the last known; the idle polls cover the rest
                log.debug("releaser addresses not read: %s", exc)
        if self._socket is None:
            self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        datagrams = encode(kinds, self._prefix)
        for address in self._known:
            try:
                for datagram in datagrams:
                    self._socket.sendto(datagram, address)
                for kind in kinds:
                    metrics.WAKEUPS_SENT.labels(label_of(kind)).inc()
            except OSError as exc:  # a listener gone or unreachable: its polls cover it
                log.debug("wake to %s not sent: %s", address, exc)

    def close(self) -> None:
        """Send what is pending, then stop the sender thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._signal.set()
        if thread is not None:
            thread.join(timeout=5)
        if self._socket is not None:
            self._socket.close()


def label_of(kind: str) -> str:
    """The metrics label of a kind: "due" for the kinds naming a topic (bounded series)."""
    return kind.split(":", 1)[0]


class DatagramListener:
    """A UDP socket on `port` (default DUETIME_WAKE_PORT; 0: any free port) whose datagrams
    go to `handle`, on a thread of its own once started; `address` is what senders are told
    ("host:port")."""

    def __init__(self, config: Config, handle: Callable[[bytes], None], name: str,
                 port: int | None = None) -> None:
        self._handle = handle
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._socket.bind(("0.0.0.0", config.wake_port if port is None else port))
        except OSError:
            self._socket.close()
            raise
        self.address = f"{advertised_host(config)}:{self._socket.getsockname()[1]}"
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            try:
                datagram = self._socket.recv(DATAGRAM_MAX + 512)
            except OSError:
                return  # closed
            try:
                self._handle(datagram)
            except Exception:  # a wake-up is a hint: never let one end the listener
                log.exception("wake-up not handled")

    def close(self) -> None:
        self._closed = True
        try:  # recv() does not return on close() alone: a datagram to ourselves ends it
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"", ("127.0.0.1", self._socket.getsockname()[1]))
        except OSError:
            pass
        self._socket.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
