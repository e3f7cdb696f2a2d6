"""Request limits through gunicorn, as a client sends them: a chunked body (no
Content-Length to trust) over the limit gets 413 problem+json once the limit is read, not
after the whole body; clients that send too slowly (slowloris) are cut at their deadline, so
they cannot hold every thread, and a body that stops coming gets 408."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from app.config import Config
from app.services import Services
from tests.serving import serving

PORT = 18091
CHUNK = 64 * 1024
BODY = 20 * 1024 * 1024  # what the client would send, were it let


def _served(config: Config, tenant: str, port: int, **settings: str) -> Iterator[str]:
    """gunicorn with one worker on `port` with these DUETIME_* settings; a key of `tenant`."""
    services = Services(config)
    key = services.keys.create(tenant)
    services.close()
    with serving(config.keyspace, port, **settings):
        yield key


@pytest.fixture()
def small_limits(config: Config) -> Iterator[str]:
    """gunicorn whose request limit is 2 x (1 KiB + 4 KiB) + 64 KiB; a key of its tenant."""
    yield from _served(config, "limits", PORT, DUETIME_MAX_BATCH="2",
                       DUETIME_MAX_PAYLOAD_BYTES="1024")


def test_a_chunked_body_over_the_limit_is_refused_without_being_read_whole(
        small_limits: str) -> None:
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as conn:
        conn.sendall((f"POST /v1/topics/limits/messages:batch HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {small_limits}\r\n"
                      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                      ).encode())
        opening = b'{"messages": [{"payload": "'  # then one string that never ends
        conn.sendall(f"{len(opening):x}\r\n".encode() + opening + b"\r\n")
        conn.setblocking(False)
        deadline = time.monotonic() + 30
        while sent < BODY and time.monotonic() < deadline:
            try:
                answer += conn.recv(65536)
                if answer:
                    break
            except BlockingIOError:
                pass
            try:
                conn.sendall(f"{CHUNK:x}\r\n".encode() + b"a" * CHUNK + b"\r\n")
                sent += CHUNK
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                time.sleep(0.01)
        conn.setblocking(True)
        while b"\r\n\r\n" not in answer:
            more = conn.recv(65536)
            if not more:
                break
            answer += more
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"application/problem+json" in rest.lower()
    assert sent < BODY // 4, sent  # refused once the limit was read, long before the end


SLOW_PORT = 18092
THREADS = 4
CLIENT_TIMEOUT_S = 2


@pytest.fixture()
def few_threads(config: Config) -> Iterator[str]:
    """gunicorn with one worker of THREADS threads, clients held to CLIENT_TIMEOUT_S."""
    yield from _served(config, "slow", SLOW_PORT, DUETIME_WEB_THREADS=str(THREADS),
                       DUETIME_CLIENT_TIMEOUT_S=str(CLIENT_TIMEOUT_S))


def _trickle(conns: list[socket.socket], until: float) -> set[int]:
    """Send each connection one more header byte every 0.2 s until `until` (monotonic);
    the indexes of those the server closed meanwhile."""
    closed: set[int] = set()
    while time.monotonic() < until and len(closed) < len(conns):
        for n, conn in enumerate(conns):
            if n in closed:
                continue
            try:
                conn.sendall(b"X")
            except OSError:
                closed.add(n)
        time.sleep(0.2)
    return closed


def test_clients_trickling_their_headers_cannot_hold_every_thread(few_threads: str) -> None:
    conns = [socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=5)
             for _ in range(2 * THREADS)]
    try:
        for conn in conns:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        time.sleep(0.5)  # every thread has taken one of them
        answered: list[float] = []
        started = time.monotonic()

        def ask() -> None:
            with socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=30) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if conn.recv(65536).startswith(b"HTTP/1.1 200"):
                    answered.append(time.monotonic() - started)

        asking = threading.Thread(target=ask)
        asking.start()
        closed = _trickle(conns, time.monotonic() + 20)
        asking.join(15)
        # the slow ones are cut at their deadline, two rounds of THREADS, then it is served
        assert answered and answered[0] < 3 * CLIENT_TIMEOUT_S + 4, answered
        assert len(closed) == len(conns), closed
    finally:
        for conn in conns:
            conn.close()


def test_a_body_that_stops_coming_gets_408(few_threads: str) -> None:
    with socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=30) as conn:
        conn.sendall((f"POST /v1/topics/slow/messages HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {few_threads}\r\nContent-Type: application/json\r\n"
                      "Content-Length: 1000\r\n\r\n{\"payload\": ").encode())
        started = time.monotonic()
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"application/problem+json" in answer.lower()
    assert CLIENT_TIMEOUT_S - 0.5 <= time.monotonic() - started < CLIENT_TIMEOUT_S + 5


def _raw_answer(port: int, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send `request` as is; the answer's status line, headers (lower-case names), body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while more := conn.recv(65536):
            answer += more
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return status_line.encode(), headers, body


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /v1/topics/" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n", 431),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
     + b"".join(b"X-H%d: v\r\n" % n for n in range(200)) + b"\r\n", 431),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", 400),
], ids=["request-line", "header-size", "header-count", "header-name"])
def test_what_gunicorn_refuses_itself_is_problem_json_too(
        small_limits: str, request_bytes: bytes, status: int) -> None:
    status_line, headers, body = _raw_answer(PORT, request_bytes)
    assert status_line.startswith(b"HTTP/1.1 %d" % status), (status_line, body[:300])
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["content-length"]) == len(body)
    problem = json.loads(body)
    assert problem["status"] == status and problem["title"] and problem["detail"]
    assert problem["type"].startswith("https://duetime.dev/problems/")
