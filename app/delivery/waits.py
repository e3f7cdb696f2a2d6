"""The long polls one API process holds: at most `most` lease calls waiting at once, and at
most `per_tenant` of them for one tenant, so one tenant's consumers cannot hold every thread
of the process (docs/design.md, "Long polls").

Each waiting call holds one request thread of its gunicorn worker (app.gunicorn_conf gives a
worker DUETIME_WEB_THREADS threads for short calls plus DUETIME_API_WAITS for waits): a call
past the tenant's share is refused at once with 429 and Retry-After, one past the process's
total with 503 and Retry-After, never left queued behind the waits.
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

    @contextlib.contextmanager
    def held(self, tenant: str) -> Iterator[None]:
        """Count one waiting call of the tenant for the block, or refuse it at once:
        TooManyWaits (429) past the tenant's share, Overloaded (503) past the total."""
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
            yield
        finally:
            metrics.LEASE_WAITS.dec()
            with self._lock:
                self._total -= 1
                left = self._of[tenant] - 1
                if left:
                    self._of[tenant] = left
                else:
                    del self._of[tenant]

    def waiting(self, tenant: str | None = None) -> int:
        """Calls waiting now, of the tenant or in all."""
        with self._lock:
            return self._total if tenant is None else self._of.get(tenant, 0)


def client_gone(environ: dict[str, Any]) -> Callable[[], bool]:
    """A check of whether the request's client has closed its connection (gunicorn puts the
    socket in the environ; without one, as in Flask's test client, never). Bytes waiting on
    the socket (a pipelined request) do not count as gone; end of stream or a reset does."""
    sock = environ.get("gunicorn.socket")
    raw = getattr(sock, "_sock", sock)  # app.gunicorn_conf._Deadline wraps the socket
    if not isinstance(raw, socket.socket):
        return lambda: False

    def gone() -> bool:
        try:
            # poll, not select (descriptors past 1024) nor a bare recv (a socket with a
            # timeout waits for data before it reads)
            ready = select.poll()
            ready.register(raw, select.POLLIN)
            if not ready.poll(0):
                return False
            return raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):  # reset, or closed here already
            return True

    return gone
