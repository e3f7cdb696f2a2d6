"""The broker's end of the API processes' connections (app.delivery.broker_wire): a hello
with the releaser's token first (any other connection is closed), then wants and withdrawals
in, answers out, one line each; a closed connection's wants are forgotten. Answers go out
through the connection's outbox, sent in order by a thread of its own: a round that answers
a stopped or cut-off API process hands its lines over and goes on, never waits on it. A
send that makes no progress for broker_wire.SEND_TIMEOUT_S closes the connection, and each
line not sent whole tells its sender (`unsent`), which gives back what it carried.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any, Protocol

from app.delivery import broker_wire
from app.delivery.broker_wire import Want

HELLO_TIMEOUT_S = 2.0  # a connection that sends no hello within this is closed
log = logging.getLogger("duetime.broker")


Unsent = Callable[[], object]


class Reply(Protocol):
    """Send a line to the want's API process, without waiting; if it is not sent whole
    (the connection failed or closed first), unsent() is called, once."""

    def __call__(self, line: bytes, unsent: Unsent | None = None) -> None: ...


class Wanted(Protocol):
    """What the server tells the broker (workers.broker.Broker)."""

    token: str

    def want(self, want: Want, reply: Reply, link: int) -> None: ...

    def withdraw(self, link: int, want_id: int) -> None: ...

    def grant(self, link: int, want_id: int) -> None: ...

    def forget_link(self, link: int) -> None: ...


class _Outbox:
    """The lines to one API process, sent in order by a thread of its own. A line whose
    send fails (no progress for SEND_TIMEOUT_S, or the connection reset) closes the
    connection: the API process cannot read a line cut short. A line sent whole is in
    flight to its process (an answer in flight, as in SQS); one cut short or never sent
    calls its unsent()."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._cond = threading.Condition()
        self._lines: collections.deque[tuple[bytes, Unsent | None]] = collections.deque()
        self._closed = False
        threading.Thread(target=self._send_loop, name="broker-outbox", daemon=True).start()

    def put(self, line: bytes, unsent: Unsent | None = None) -> None:
        with self._cond:
            if not self._closed:
                self._lines.append((line, unsent))
                self._cond.notify()
                return
        if unsent is not None:
            unsent()

    def close(self) -> None:
        """No more sends; every line not sent calls its unsent()."""
        with self._cond:
            self._closed = True
            left = list(self._lines)
            self._lines.clear()
            self._cond.notify()
        for _, unsent in left:
            if unsent is not None:
                unsent()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._lines) or self._closed)
                if not self._lines:
                    return
                line, unsent = self._lines.popleft()
            try:
                self._sock.sendall(line)
            except OSError as exc:
                log.warning("broker: a connection closed, a send failed: %r", exc)
                # its reader then ends, and the broker forgets the connection's wants
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
                if unsent is not None:
                    unsent()
                self.close()
                return


class _Handler(socketserver.StreamRequestHandler):
    """One API process's connection: wants in, answers out through its outbox."""

    server: BrokerServer

    def handle(self) -> None:
        link = id(self)
        sock = self.request
        outbox = _Outbox(sock)
        self.server.opened(sock)
        try:
            if not self._introduced():
                log.warning("broker: a connection from %s without this releaser's token closed",
                            self.client_address[0])
                return
            for line in self.rfile:
                try:
                    self._dispatch(broker_wire.decode_line(line), outbox.put, link)
                except (ValueError, KeyError, TypeError):
                    log.warning("broker: malformed line dropped")
        except OSError:
            pass
        finally:
            self.server.broker.forget_link(link)
            outbox.close()
            self.server.closed(sock)

    def _dispatch(self, message: dict[str, Any], reply: Reply, link: int) -> None:
        """Hand one line to the broker: a withdraw, a grant, or else a want."""
        broker = self.server.broker
        if (withdrawn := broker_wire.decode_notice(message, "withdraw")) is not None:
            broker.withdraw(link, withdrawn)
        elif (granted := broker_wire.decode_notice(message, "grant")) is not None:
            broker.grant(link, granted)
        else:
            broker.want(broker_wire.decode_want(message), reply, link)

    def _introduced(self) -> bool:
        """Whether the connection's first line, within HELLO_TIMEOUT_S, is a hello with this
        releaser's token."""
        self.request.settimeout(HELLO_TIMEOUT_S)
        try:
            token = broker_wire.decode_hello(broker_wire.decode_line(self.rfile.readline()))
        except (ValueError, KeyError, TypeError, OSError):
            return False
        self.request.settimeout(None)  # wants come when calls wait; sends stay bounded
        return hmac.compare_digest(token.encode(), self.server.broker.token.encode())


class BrokerServer(socketserver.ThreadingTCPServer):
    """The broker's TCP listener: one thread per API process's connection."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # every API process of a host may connect at once
    block_on_close = False

    def __init__(self, address: tuple[str, int], broker: Wanted) -> None:
        self.broker = broker
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def opened(self, sock: socket.socket) -> None:
        broker_wire.bound_sends(sock)
        with self._open_lock:
            self._open.add(sock)

    def closed(self, sock: socket.socket) -> None:
        with self._open_lock:
            self._open.discard(sock)

    def close_all(self) -> None:
        self.server_close()
        with self._open_lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
