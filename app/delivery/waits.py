"""The long polls one API process holds: at most `most` lease calls waiting at once, and at
most `per_tenant` of them for one tenant, so one tenant's consumers cannot hold every thread
of the process (docs/design.md, "Long polls").

Each waiting call holds one request thread of its gunicorn worker (app.gunicorn_conf gives a
worker DUETIME_WEB_THREADS threads for short calls plus DUETIME_API_WAITS for waits): a call
past the tenant's share is refused at once with 429 and Retry-After, one past the process's
total with 503 and Retry-After, never left queued behind the waits. One thread of the
process watches the waiting calls' sockets, so a client that leaves ends its call's wait at
once.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from app.errors import Overloaded, RateLimited
from app.ops import metrics

RETRY_AFTER_S = 1


class TooManyWaits(RateLimited):
    """The tenant holds its share of this process's waiting lease calls (429)."""

    title, slug = "Too many waiting calls", "too-many-waits"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, RETRY_AFTER_S)


class Waits:
    """Counts of waiting lease calls in this process, in all and per tenant. Thread-safe."""

    def __init__(self, most: int, per_tenant: int) -> None:
        self.most = most
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._total = 0
        self._of: dict[str, int] = {}
        self._watcher = _Watcher()

    @contextlib.contextmanager
    def held(self, tenant: str, environ: dict[str, Any]) -> Iterator[Departure]:
        """Count one waiting call of the tenant for the block, or refuse it at once:
        TooManyWaits (429) past the tenant's share, Overloaded (503) past the total. Yields
        the call's Departure: whether its client (the request's socket, in `environ`) left."""
        with self._lock:
            mine = self._of.get(tenant, 0)
            if mine >= self.per_tenant:
                raise TooManyWaits(
                    f"This API process holds {mine} waiting lease calls of this tenant, its "
                    f"most (DUETIME_API_WAITS_PER_TENANT); retry in a moment, or lease with "
                    f"fewer consumers waiting at once.")
            if self._total >= self.most:
                raise Overloaded(f"This API process holds {self._total} waiting lease calls, "
                                 "its most (DUETIME_API_WAITS); retry in a moment.")
            self._total += 1
            self._of[tenant] = mine + 1
        metrics.LEASE_WAITS.inc()
        try:
            with self._watcher.watching(environ) as departure:
                yield departure
        finally:
            metrics.LEASE_WAITS.dec()
            with self._lock:
                self._total -= 1
                left = self._of[tenant] - 1
                if left:
                    self._of[tenant] = left
                else:
                    del self._of[tenant]


class Departure:
    """Whether a waiting call's client has left (closed its connection): set once, by the
    process's watcher (Waits); each listener (the call's wait) is told at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left = False
        self._listeners: list[Callable[[], object]] = []

    def __call__(self) -> bool:
        return self._left

    def on_leave(self, listener: Callable[[], object]) -> Callable[[], None]:
        """Call listener when the client leaves (now, if it has); returns what removes it
        (a call asks its owners again and again within one wait)."""
        with self._lock:
            if not self._left:
                self._listeners.append(listener)
                return lambda: self._forget(listener)
        listener()
        return _nothing

    def _forget(self, listener: Callable[[], object]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def leave(self) -> None:
        with self._lock:
            if self._left:
                return
            self._left = True
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()


class _Staying(Departure):
    """A client never seen to leave (a call that does not wait, or no socket to watch)."""

    def on_leave(self, listener: Callable[[], object]) -> Callable[[], None]:
        return _nothing

    def leave(self) -> None:
        pass


def _nothing() -> None:
    pass


STAYING = _Staying()


class _Watcher:
    """One thread per process watching the sockets of its waiting calls (epoll, for a
    peer's hang-up): a client that closes its connection is told to its call's Departure
    at once, without waking the waiting threads (Linux; elsewhere no socket is watched)."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._lock = threading.Lock()
        self._watched: dict[int, Departure] = {}
        self._started = False

    @contextlib.contextmanager
    def watching(self, environ: dict[str, Any]) -> Iterator[Departure]:
        sock = environ.get("gunicorn.socket")
        raw = getattr(sock, "_sock", sock)  # app.gunicorn_conf._Deadline wraps the socket
        if self._epoll is None or not isinstance(raw, socket.socket):
            yield STAYING
            return
        departure = Departure()
        fd = raw.fileno()
        with self._lock:
            if not self._started:
                threading.Thread(target=self._watch_loop, name="waits-watcher",
                                 daemon=True).start()
                self._started = True
            self._watched[fd] = departure
            self._epoll.register(fd, _HANG_UP)
        try:
            yield departure
        finally:
            with self._lock:
                if self._watched.pop(fd, None) is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)

    def _watch_loop(self) -> None:
        assert self._epoll is not None
        while True:
            for fd, _ in self._epoll.poll(1.0):
                # the event may be of a call that ended meanwhile, its descriptor's number
                # now another's: the socket there now must be hung up itself
                if not _hung_up(fd):
                    continue
                with self._lock:
                    departure = self._watched.pop(fd, None)
                    if departure is not None:
                        with contextlib.suppress(OSError, ValueError):
                            self._epoll.unregister(fd)
                if departure is not None:
                    departure.leave()


def _hung_up(fd: int) -> bool:
    """Whether the socket at descriptor fd has its peer's hang-up (or an error) now."""
    probe = select.poll()
    probe.register(fd, getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR)
    return bool(probe.poll(0))


# a peer's FIN (its close), a reset or an error; not data (a pipelined request)
_HANG_UP = getattr(select, "EPOLLRDHUP", 0x2000) | getattr(select, "EPOLLHUP", 0x10) | \
    getattr(select, "EPOLLERR", 0x8)
