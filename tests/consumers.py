"""Test helpers: a topic API wrapper whose every lease asserts "never before deliver_at"."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from flask.testing import FlaskClient

from app.core.timeparse import parse_instant


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class TopicClient:
    """Calls one topic's endpoints; records every leased message and checks it is not early."""

    def __init__(self, client: FlaskClient, headers: dict[str, str], name: str | None = None,
                 clock: Callable[[], int] = now_ms, **settings: Any) -> None:
        """clock: the server's clock (epoch ms), against which no lease may be early."""
        self.client = client
        self.clock = clock
        self.headers = headers
        self.name = name or f"topic{secrets.token_hex(3)}"
        answer = client.put(f"/v1/topics/{self.name}", json=settings, headers=headers)
        assert answer.status_code in (200, 201), answer.get_json()
        self.received: list[dict[str, Any]] = []

    def url(self, path: str = "") -> str:
        return f"/v1/topics/{self.name}{path}"

    def enqueue(self, **message: Any) -> Any:
        message.setdefault("payload", {"n": 1})
        return self.client.post(self.url("/messages"), json=message, headers=self.headers)

    def batch(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            if "payload_base64" not in m:
                m.setdefault("payload", {"n": 1})
        answer = self.client.post(self.url("/messages:batch"), json={"messages": messages},
                                  headers=self.headers)
        assert answer.status_code == 200, answer.get_json()
        results: list[dict[str, Any]] = answer.get_json()["results"]
        return results

    def lease(self, max_messages: int = 10, wait_ms: int = 0, **extra: Any) -> list[dict[str, Any]]:
        answer = self.client.post(self.url("/leases"), headers=self.headers,
                                  json={"max": max_messages, "wait_ms": wait_ms, **extra})
        received_at = self.clock()
        assert answer.status_code == 200, answer.get_json()
        messages: list[dict[str, Any]] = answer.get_json()["messages"]
        for m in messages:
            assert parse_instant(m["deliver_at"]) <= received_at, f"early delivery: {m}"
            m["received_at"] = received_at
        self.received.extend(messages)
        return messages

    def ack(self, message: dict[str, Any]) -> int:
        return self.client.post(self.url(f"/messages/{message['id']}/ack"), headers=self.headers,
                                json={"lease_token": message["lease"]["token"]}).status_code

    def ack_all(self, messages: list[dict[str, Any]]) -> list[str]:
        """Ack them in one call (POST /acks); the ids whose ack answered 204."""
        if not messages:
            return []
        answer = self.client.post(self.url("/acks"), headers=self.headers, json={"acks": [
            {"id": m["id"], "lease_token": m["lease"]["token"]} for m in messages]})
        assert answer.status_code == 200, answer.get_json()
        return [r["id"] for r in answer.get_json()["results"] if r["status"] == 204]

    def get(self, message_id: str) -> Any:
        return self.client.get(self.url(f"/messages/{message_id}"), headers=self.headers)

    def drain(self, expected: int, within_s: float, max_messages: int = 100) -> set[str]:
        """Lease and ack until `expected` distinct ids were delivered or time runs out."""
        delivered: set[str] = set()
        deadline = time.monotonic() + within_s
        while len(delivered) < expected and time.monotonic() < deadline:
            for m in self.lease(max_messages, wait_ms=200):
                if self.ack(m) == 204:
                    delivered.add(m["id"])
        return delivered
