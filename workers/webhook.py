"""Webhook POSTs of API.md (Consuming: push): body = payload, Duetime-* headers, HMAC signature.

A target's answer is an outcome, never an exception: 2xx is delivered, anything else (status,
timeout, refused connection) is an error string kept on the message as last_error.
"""

from __future__ import annotations

import hashlib
import hmac
import threading

import requests

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
    """POSTs with one keep-alive connection pool per thread (requests.Session is not
    thread-safe)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def post(self, topic: Topic, row: MessageState, payload: Payload | None) -> str | None:
        """None when the target answered 2xx within the topic's timeout, else why not."""
        if payload is None:
            return "payload missing"
        url = topic.settings.delivery_url or ""
        try:
            answer = self._session().post(
                url, data=payload.data, headers=request_headers(topic, row, payload),
                timeout=topic.settings.delivery_timeout_seconds, allow_redirects=False)
        except requests.Timeout:
            return f"timeout after {topic.settings.delivery_timeout_seconds:g} s"
        except requests.RequestException as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= answer.status_code < 300:
            return None
        return f"HTTP {answer.status_code}: {answer.text[:200]}"
