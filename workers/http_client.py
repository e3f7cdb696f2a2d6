"""A small asyncio HTTP/1.1 client for webhook POSTs: keep-alive connections per origin, one
write per request, responses parsed by httptools (llhttp, the parser of Node.js).

Why not a thread per POST (urllib3): a burst of thousands of POSTs a second spent most of the
releaser's core switching threads and in Python-level HTTP parsing; one event loop with a C
parser sends the same POSTs for a fraction of the CPU.

Guarantees: a request either returns (status, first MAX_BODY bytes of the body) or raises
(OSError for connection failures, TimeoutError past `timeout_s`, HttpError for a malformed or
cut-off answer). Redirects are not followed. TLS (https) uses the default certificate checks.
Every address a target's name resolves to is checked before connecting
(app.delivery.webhook_targets: no loopback, private, link-local ... address unless allowed), and the
connection goes to the
address checked, so a name cannot resolve elsewhere in between (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import defaultdict
from typing import cast
from urllib.parse import urlsplit

import httptools

from app.delivery.webhook_targets import Network, refusal

MAX_BODY = 1024  # bytes of an answer's body kept (it only goes into last_error)
IDLE_PER_ORIGIN = 256  # idle keep-alive connections kept per origin; more are closed


class HttpError(Exception):
    """The target's answer was not a well-formed HTTP/1.1 response."""


class RefusedTarget(OSError):
    """The target's name resolves to an address webhooks may not reach."""


Origin = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None
        self.body = bytearray()
        self.status = 0
        self.got_bytes = False  # any byte of the current answer arrived
        self.framed = False  # the answer has a Content-Length or is chunked
        self.reusable = True
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.reusable = False
            self._settle(HttpError(f"malformed answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and not self.framed:
            # an answer without a length ends at the close of the connection
            self._settle((self.status, bytes(self.body)))
        else:
            self._settle(HttpError("connection closed before the answer was complete"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.reusable = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if len(self.body) < MAX_BODY:
            self.body += body[:MAX_BODY - len(self.body)]

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the final one follows
            self.status, self.framed = 0, False
            self.body.clear()
            return
        self._settle((self.status, bytes(self.body)))

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.body.clear()
        self.status = 0
        self.got_bytes = self.framed = False
        self.transport.write(request)
        return self.answer

    def _settle(self, outcome: tuple[int, bytes] | Exception) -> None:
        answer, self.answer = self.answer, None
        if answer is None or answer.done():
            return
        if isinstance(outcome, Exception):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class AsyncHttpClient:
    """Keep-alive connection pools per origin, for one event loop. Not thread-safe: call it
    from its loop only. The caller bounds concurrency (connections open = requests in flight).
    """

    def __init__(self, allow: tuple[Network, ...] = ()) -> None:
        self._idle: dict[Origin, list[_Connection]] = defaultdict(list)
        self._tls = ssl.create_default_context()
        self.allow = allow  # networks allowed although not public (DUETIME_WEBHOOK_ALLOW)

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   timeout_s: float) -> tuple[int, bytes]:
        """POST body to url; (status, up to MAX_BODY bytes of the answer's body)."""
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # a port that is not a number
            port = 0
        if parts.scheme not in ("http", "https") or not parts.hostname or not port:
            raise HttpError(f"not an http(s) URL: {url!r}")
        origin = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rsplit("@", 1)[-1]
        request = _request_bytes(target, host, headers, body)
        async with asyncio.timeout(timeout_s):
            reused = self._take_idle(origin)
            if reused is not None:
                try:
                    return await self._exchange(origin, reused, request)
                except HttpError:
                    if reused.got_bytes:
                        raise
                    # the target closed an idle connection as we reused it: the request was
                    # not read, so it goes again on a fresh connection (as every client does)
            return await self._exchange(origin, await self._connect(origin), request)

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle[origin]
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, sockaddr in found:
            reason = refusal(str(sockaddr[0]), self.allow)
            if reason is not None:
                raise RefusedTarget(f"webhook target refused: {host} resolves to {reason}")
        tls = scheme == "https"
        _, conn = await loop.create_connection(
            _Connection, str(found[0][4][0]), port, ssl=self._tls if tls else None,
            server_hostname=host if tls else None)
        return conn

    async def _exchange(self, origin: Origin, conn: _Connection,
                        request: bytes) -> tuple[int, bytes]:
        try:
            answer = await conn.send(request)
        except BaseException:
            conn.close()  # cancelled (timeout) or failed mid-answer: never reuse it
            raise
        if conn.reusable and not conn.closed and len(self._idle[origin]) < IDLE_PER_ORIGIN:
            self._idle[origin].append(conn)
        else:
            conn.close()
        return answer

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _request_bytes(target: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise HttpError(f"header {name!r} has a line break")
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
