"""Webhook POSTs of API.md (Consuming: push): body = payload, Duetime-* headers, HMAC signature.

A target's answer is an outcome, never an exception: 2xx is delivered, anything else (status,
timeout, refused connection) is an error string kept on the message as last_error.
"""

from __future__ import annotations

import hashlib
import hmac

import urllib3

from app.models import MessageState, Payload, Topic
from app.timeparse import format_ms

CONTENT_TYPES = {"json": "application/json", "base64": "application/octet-stream"}


def signature(secret: str, body: bytes) -> str:
    """Duetime-Signature: lowercase hex HMAC-SHA256 of the exact body bytes, keyed by the
    topic's signing secret (UTF-8)."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def request_headers(topic: Topic, row: MessageState, payload: Payload) -> dict[str, str]:
    """The message's own headers, then ours (ours win on a clash)."""
    return {
        **payload.headers,
        "Content-Type": CONTENT_TYPES.get(payload.encoding, "application/octet-stream"),
        "Duetime-Message-Id": row.id,
        "Duetime-Topic": topic.name,
        "Duetime-Attempt": str(row.attempts),
        "Duetime-Deliver-At": format_ms(row.deliver_at_ms),
        "Duetime-Signature": signature(topic.signing_secret, payload.data),
    }


class WebhookPoster:
    """POSTs through one thread-safe keep-alive pool per target host (urllib3; no proxy
    environment lookups per request, which cost more CPU than the POST itself)."""

    def __init__(self, connections_per_host: int = 64) -> None:
        self._pool = urllib3.PoolManager(num_pools=256, maxsize=connections_per_host,
                                         retries=False, block=False)

    def post(self, topic: Topic, row: MessageState, payload: Payload | None) -> str | None:
        """None when the target answered 2xx within the topic's timeout, else why not."""
        if payload is None:
            return "payload missing"
        timeout = topic.settings.delivery_timeout_seconds
        try:
            answer = self._pool.request(
                "POST", topic.settings.delivery_url or "", body=payload.data,
                headers=request_headers(topic, row, payload), redirect=False,
                timeout=urllib3.Timeout(total=timeout), preload_content=True)
        except urllib3.exceptions.NewConnectionError as exc:  # before TimeoutError: a subclass
            return f"connection failed: {exc}"
        except urllib3.exceptions.TimeoutError:
            return f"timeout after {timeout:g} s"
        except urllib3.exceptions.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= answer.status < 300:
            return None
        return f"HTTP {answer.status}: {answer.data[:200].decode('utf-8', 'replace')}"
