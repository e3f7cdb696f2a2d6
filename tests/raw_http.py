"""HTTP/1.1 over asyncio streams, one request a connection: thousands of waiting calls from
one test or bench process without a thread each (tests/test_long_polls.py,
tests/bench/long_polls.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    took_s: float  # from sending the request to the end of the answer

    def json(self) -> Any:
        return json.loads(self.body)


def _request_bytes(method: str, path: str, headers: dict[str, str], body: object) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
            f"Content-Length: {len(data)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class Sent:
    """A request sent on its own connection, its answer not read yet: read it, or leave
    (close the connection without reading)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 started: float) -> None:
        self._reader = reader
        self._writer = writer
        self._started = started

    async def answer(self) -> Answer:
        try:
            raw = await self._reader.read()
        finally:
            self._writer.close()
        top, _, content = raw.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        status = int(lines[0].split()[1]) if lines[0] else 0
        return Answer(status, headers, content, time.monotonic() - self._started)

    def leave(self) -> None:
        self._writer.close()


async def send(port: int, method: str, path: str, headers: dict[str, str] | None = None,
               body: object = None) -> Sent:
    """Connect to 127.0.0.1:port and send one request."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request_bytes(method, path, headers or {}, body))
    await writer.drain()
    return Sent(reader, writer, started)


async def call(port: int, method: str, path: str, headers: dict[str, str] | None = None,
               body: object = None) -> Answer:
    """One request and its answer."""
    return await (await send(port, method, path, headers, body)).answer()
