"""The broker's end of the API processes' connections (app.delivery.broker_wire): a hello
with the releaser's token first (any other connection is closed), then wants and withdrawals
in, answers out, one line each; a closed connection's wants are forgotten. An answer that
cannot be written within broker_wire.SEND_TIMEOUT_S (the API process is stopped, or cut off)
closes the connection: no broker thread waits longer on one process.
"""

from __future__ import annotations

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


class Wanted(Protocol):
    """What the server tells the broker (workers.broker.Broker)."""

    token: str

    def want(self, want: Want, reply: Callable[[bytes], None], link: int) -> None: ...

    def withdraw(self, link: int, want_id: int) -> None: ...

    def grant(self, link: int, want_id: int) -> None: ...

    def forget_link(self, link: int) -> None: ...


class _Handler(socketserver.StreamRequestHandler):
    """One API process's connection: wants in, answers out."""

    server: BrokerServer

    def handle(self) -> None:
        link = id(self)
        lock = threading.Lock()
        sock = self.request

        def reply(line: bytes) -> None:
            with lock:
                try:
                    sock.sendall(line)
                except OSError:
                    # a line cut short leaves the stream unreadable: the connection ends,
                    # its reader forgets its wants, and the caller gives back what it carried
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    raise

        self.server.opened(sock)
        try:
            if not self._introduced():
                log.warning("broker: a connection from %s without this releaser's token closed",
                            self.client_address[0])
                return
            for line in self.rfile:
                try:
                    self._dispatch(broker_wire.decode_line(line), reply, link)
                except (ValueError, KeyError, TypeError):
                    log.warning("broker: malformed line dropped")
        except OSError:
            pass
        finally:
            self.server.broker.forget_link(link)
            self.server.closed(sock)

    def _dispatch(self, message: dict[str, Any], reply: Callable[[bytes], None],
                  link: int) -> None:
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
