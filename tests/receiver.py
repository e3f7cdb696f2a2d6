"""A real local HTTP server standing in for a webhook target: records every POST it gets.

It runs on an event loop (httptools parses), so a burst of thousands of POSTs a second is
received without the thread-per-connection cost that would otherwise be measured instead of
the releaser.

`script` decides each answer: a function of (message id, how many times that id arrived
before) returning an HTTP status; `gate`, when set, holds every request until it is opened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from typing import cast

import httptools

from tests.loop_thread import LoopThread


@dataclasses.dataclass(frozen=True)
class Arrival:
    message_id: str
    received_ms: int
    headers: dict[str, str]
    body: bytes
    path: str = ""
    answered: bool = True  # False: the sender had gone when the answer was due
    answered_ms: int = 0  # when the answer was written (0: at once, on arrival)


class Receiver:
    def __init__(self, script: Callable[[str, int], int] | None = None,
                 gate: threading.Event | None = None) -> None:
        self.script = script or (lambda message_id, before: 200)
        self.gate = gate
        self.arrivals: list[Arrival] = []
        self._seen: Counter[str] = Counter()
        self.started = 0  # requests that reached the handler, gated or not
        self._lock = threading.Lock()
        self.url = ""

    def record(self, arrival: Arrival) -> int:
        with self._lock:
            before = self._seen[arrival.message_id]
            self._seen[arrival.message_id] += 1
            self.arrivals.append(arrival)
        return self.script(arrival.message_id, before)

    def ids(self) -> list[str]:
        with self._lock:
            return [a.message_id for a in self.arrivals]

    def distinct(self) -> int:
        with self._lock:
            return len(self._seen)

    def wait_for(self, predicate: Callable[[list[Arrival]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(list(self.arrivals)):
                    return True
            time.sleep(0.02)
        return False

    def wait_distinct(self, count: int, timeout_s: float) -> bool:
        """Wait until `count` distinct message ids arrived (cheap to poll)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.distinct() >= count:
                return True
            time.sleep(0.05)
        return False


class _Connection(asyncio.Protocol):
    """One client connection: each complete request is recorded, then answered in order."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.path = ""
        self.answered: asyncio.Future[None] | None = None  # the previous request's answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = bytearray()
        self.path = ""

    def on_url(self, url: bytes) -> None:
        self.path += url.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1")] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        received = time.time_ns() // 1_000_000
        arrival = Arrival(self.headers.get("Duetime-Message-Id", ""), received, self.headers,
                          bytes(self.body), self.path)
        with self.receiver._lock:
            self.receiver.started += 1
        if self.receiver.gate is None and self.answered is None:
            self._answer(self.receiver.record(arrival))
        else:
            previous = self.answered
            self.answered = asyncio.get_running_loop().create_task(self._gated(arrival, previous))

    async def _gated(self, arrival: Arrival, previous: asyncio.Future[None] | None) -> None:
        if self.receiver.gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.receiver.gate.wait, 30)
        if previous is not None:
            await previous  # answers leave in the order the requests came
        assert self.transport is not None
        if self.transport.is_closing():  # the sender gave up while the gate held it
            self.receiver.record(dataclasses.replace(arrival, answered=False))
            return
        self._answer(self.receiver.record(dataclasses.replace(
            arrival, answered_ms=time.time_ns() // 1_000_000)))

    def _answer(self, status: int) -> None:
        assert self.transport is not None
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "X"
        # status line, headers and body in one write: no wait on the client's delayed ACK
        self.transport.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Length: 2\r\n\r\nok"
                             .encode("latin-1"))


@contextmanager
def receiving(receiver: Receiver) -> Iterator[Receiver]:
    """Serve on 127.0.0.1 (a free port) from an event loop thread until the block ends."""
    runner = LoopThread("receiver")

    connections: list[_Connection] = []

    def connect() -> _Connection:
        connections.append(_Connection(receiver))
        return connections[-1]

    async def serve() -> asyncio.Server:
        return await runner.loop.create_server(connect, "127.0.0.1", 0)

    server = runner.run(serve())
    port = server.sockets[0].getsockname()[1]
    receiver.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        async def close() -> None:
            server.close()
            for conn in connections:
                if conn.transport is not None:
                    conn.transport.abort()

        runner.run(close())
        runner.stop()
