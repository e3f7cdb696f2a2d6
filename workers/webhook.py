"""Webhook POSTs (openapi.yaml, topics' `delivery`): body = payload, Duetime-* headers,
Standard Webhooks signatures (app.delivery.signing).

A target's answer is an outcome, never an exception: 2xx is delivered, anything else (status,
timeout, refused connection) is an error string kept on the message as last_error.
"""

from __future__ import annotations

import os
import ssl

from app.core.timeparse import format_ms
from app.delivery import signing
from app.messages.headers import allowed_headers
from app.models import MessageState, Payload, Topic
from workers.http_client import AsyncHttpClient, HttpError

CONTENT_TYPES = {"json": "application/json", "base64": "application/octet-stream"}


def request_headers(topic: Topic, row: MessageState, payload: Payload,
                    now_ms: int) -> dict[str, str]:
    """The message's own headers, then ours, signed at now_ms (epoch ms) by every secret of
    the topic active then (app.delivery.signing). Of its own, only those it may carry
    (app.messages.headers) go: none named as one of ours in any case, so none goes twice;
    rows enqueued before that check may hold others."""
    timestamp_s = now_ms // 1000
    return {
        **allowed_headers(payload.headers),
        "Content-Type": CONTENT_TYPES.get(payload.encoding, "application/octet-stream"),
        "Duetime-Message-Id": row.id,
        "Duetime-Topic": topic.name,
        "Duetime-Attempt": str(row.attempts),
        "Duetime-Deliver-At": format_ms(row.deliver_at_ms),
        "Duetime-Signature": signing.body_signature(topic.signing_secret, payload.data),
        "webhook-id": row.id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": signing.standard_signature(
            topic.signing_secrets(now_ms), row.id, timestamp_s, payload.data),
    }


async def post_outcome(client: AsyncHttpClient, url: str, headers: dict[str, str], body: bytes,
                       timeout_s: float) -> str | None:
    """POST once: None when the target answered 2xx within timeout_s, else why not (kept on
    the message as last_error)."""
    try:
        status, answer = await client.post(url, body, headers, timeout_s)
    except TimeoutError:
        return f"timeout after {timeout_s:g} s"
    except ssl.SSLError as exc:  # before OSError: a subclass
        return f"TLS failed: {exc.reason or exc}"
    except OSError as exc:
        reason = (os.strerror(exc.errno) if exc.errno and exc.errno > 0
                  else exc.strerror or str(exc))  # name lookups have negative errnos
        return f"connection failed: {reason}"
    except HttpError as exc:
        return str(exc)
    if 200 <= status < 300:
        return None
    return f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}"
