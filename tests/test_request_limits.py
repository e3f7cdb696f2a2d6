"""Request limits through gunicorn, as a client sends them: a chunked body (no
Content-Length to trust) over the limit gets 413 problem+json once the limit is read, not
after the whole body."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from app.config import Config
from app.services import Services
from tests.serving import start_api, wait_ready

PORT = 18091
CHUNK = 64 * 1024
BODY = 20 * 1024 * 1024  # what the client would send, were it let


@pytest.fixture()
def small_limits(config: Config) -> Iterator[str]:
    """gunicorn whose request limit is 2 x (1 KiB + 4 KiB) + 64 KiB; a key of its tenant."""
    services = Services(config)
    key = services.keys.create("limits")
    services.close()
    process = start_api({**os.environ, "DUETIME_HTTP_PORT": str(PORT),
                         "DUETIME_KEYSPACE": config.keyspace, "DUETIME_WEB_WORKERS": "1",
                         "DUETIME_MAX_BATCH": "2", "DUETIME_MAX_PAYLOAD_BYTES": "1024"})
    try:
        assert wait_ready(f"http://127.0.0.1:{PORT}", process), "API did not start"
        yield key
    finally:
        process.terminate()
        process.wait(30)


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
