"""A real local HTTP server standing in for a webhook target: records every POST it gets.

`script` decides each answer: a function of (message id, how many times that id arrived
before) returning an HTTP status; `gate`, when set, holds every request until it is opened.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass(frozen=True)
class Arrival:
    message_id: str
    received_ms: int
    headers: dict[str, str]
    body: bytes


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


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Status line, headers and body leave in one write, with Nagle off: otherwise the
        # body's small second write waits for the client's delayed ACK, 40 ms a request.
        disable_nagle_algorithm = True
        wbufsize = 64 * 1024

        def do_POST(self) -> None:
            received = time.time_ns() // 1_000_000
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver._lock:
                receiver.started += 1
            if receiver.gate is not None:
                receiver.gate.wait(30)
            status = receiver.record(Arrival(self.headers.get("Duetime-Message-Id", ""),
                                             received, dict(self.headers.items()), body))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            return

    return Handler


@contextmanager
def receiving(receiver: Receiver) -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
