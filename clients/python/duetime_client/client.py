"""A Python client of the duetime HTTP API (`pip install ./clients/python`, then
`from duetime_client import Client`).

- Client: one typed call per route. Answers are the API's JSON as dicts; an error answer
  raises ApiError with its problem+json. 429 and 503 are retried with exponential backoff
  (the answer's Retry-After when it gives one), `retries` times. A connection that could not
  be opened is retried for every call (the request never left); one cut after the request
  was sent only for idempotent calls (GET, PUT, DELETE, and enqueues that carry an id).
  No answer at all raises ApiUnreachable (a ConnectionError) or ApiTimeout (a TimeoutError).
- Consumer: lease → handler → ack on threads of its own; an exception in the handler nacks
  the message with the error; a handler that runs long has its lease extended; stop() ends
  after the messages in hand are finished.
- verify_webhook and SignatureCheck: check a webhook POST's Standard Webhooks signature
  (webhook-id, webhook-timestamp, webhook-signature) with the topic's signing_secret, and
  refuse one whose timestamp is outside the tolerance (a replay), in any WSGI app;
  verify_signature checks the deprecated Duetime-Signature (body only, replayable).

The transport is urllib3's keep-alive connection pool, shared by the client's threads: one
call costs about a third of the client CPU of a requests.Session call (tests/bench/single.py
measures the API through this client).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as NoAnswerInTime

JSON = dict[str, Any]
RETRIED_STATUSES = (429, 503)
log = logging.getLogger("duetime.client")


class ApiError(Exception):
    """An error answer: its status and problem+json (type, title, detail, errors)."""

    def __init__(self, status: int, problem: JSON) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


class ApiUnreachable(ConnectionError):
    """No answer: the connection to the API could not be opened, or was cut before the
    answer came (then the call may or may not have taken effect)."""


class ApiTimeout(TimeoutError):
    """No answer within the client's timeout_s (the call may or may not have taken effect)."""


class Client:
    """The API at base_url (e.g. http://127.0.0.1:8080, or https://host/prefix) with one API
    key. Thread-safe: threads share up to `connections` kept-alive connections (a thread
    finding none idle opens one more, closed after its call)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 40.0,
                 retries: int = 5, backoff_s: float = 0.2, connections: int = 32) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._prefix = urlsplit(self.base_url).path
        self._pool = urllib3.connection_from_url(
            self.base_url, maxsize=connections, block=False,
            timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s))
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._json_headers = {**self._headers, "Content-Type": "application/json"}

    def close(self) -> None:
        """Close the kept-alive connections (the next call opens new ones)."""
        self._pool.close()

    def request(self, method: str, path: str, body: JSON | None = None,
                idempotent: bool | None = None) -> Any:
        """One call; the JSON answer (None for 204). Retries as the module says."""
        idempotent = method in ("GET", "PUT", "DELETE") if idempotent is None else idempotent
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers if data is None else self._json_headers
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            pause_s = self.backoff_s * 2 ** attempt
            try:
                answer = self._pool.urlopen(method, self._prefix + path, body=data,
                                            headers=headers, retries=False, redirect=False)
            except (NewConnectionError, ConnectTimeoutError) as exc:  # never sent
                if last:
                    raise ApiUnreachable(f"{self.base_url}: {exc}") from exc
            except NoAnswerInTime as exc:
                raise ApiTimeout(f"{method} {path}: no answer within {self.timeout_s} s"
                                 ) from exc
            except HTTPError as exc:  # cut after sending, or a broken answer
                if not idempotent or last:
                    raise ApiUnreachable(f"{method} {path}: {exc}") from exc
            else:
                if answer.status not in RETRIED_STATUSES or last:
                    return _answer(answer)
                hint = answer.headers.get("Retry-After", "")
                pause_s = float(hint) if hint.isdigit() else pause_s
            time.sleep(pause_s)
        raise AssertionError("unreachable")

    # topics
    def put_topic(self, topic: str, **settings: Any) -> JSON:
        return dict(self.request("PUT", f"/v1/topics/{topic}", settings))

    def get_topic(self, topic: str) -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}"))

    def list_topics(self) -> list[JSON]:
        return list(self.request("GET", "/v1/topics")["topics"])

    def delete_topic(self, topic: str) -> None:
        self.request("DELETE", f"/v1/topics/{topic}")

    def stats(self, topic: str, window: str = "minute") -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}/stats?window={window}"))

    # messages
    def enqueue(self, topic: str, payload: Any, **fields: Any) -> JSON:
        """One message: payload and any of id, deliver_at, delay_ms, local_time, timezone,
        priority, campaign, group. Retried on a lost connection only when it has an id."""
        return dict(self.request("POST", f"/v1/topics/{topic}/messages",
                                 {"payload": payload, **fields},
                                 idempotent="id" in fields))

    def enqueue_batch(self, topic: str, messages: list[JSON]) -> list[JSON]:
        """Up to 1,000 messages; a result per message, in order."""
        return list(self.request("POST", f"/v1/topics/{topic}/messages:batch",
                                 {"messages": messages},
                                 idempotent=all("id" in m for m in messages))["results"])

    def get(self, topic: str, message_id: str) -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}/messages/{message_id}"))

    def cancel(self, topic: str, message_id: str) -> None:
        self.request("DELETE", f"/v1/topics/{topic}/messages/{message_id}")

    def reschedule(self, topic: str, message_id: str, **when: Any) -> JSON:
        """deliver_at=... or delay_ms=..."""
        return dict(self.request("PATCH", f"/v1/topics/{topic}/messages/{message_id}", when,
                                 idempotent=True))

    # consuming
    def lease(self, topic: str, max_messages: int = 10, wait_ms: int = 0,
              **options: Any) -> list[JSON]:
        """Leased messages (lease_seconds, consumer optional), each with lease.token."""
        return list(self.request("POST", f"/v1/topics/{topic}/leases",
                                 {"max": max_messages, "wait_ms": wait_ms, **options})["messages"])

    def ack(self, topic: str, message: JSON) -> None:
        self.request("POST", f"/v1/topics/{topic}/messages/{message['id']}/ack",
                     {"lease_token": message["lease"]["token"]}, idempotent=True)

    def ack_many(self, topic: str, messages: Iterable[JSON]) -> list[JSON]:
        acks = [{"id": m["id"], "lease_token": m["lease"]["token"]} for m in messages]
        return list(self.request("POST", f"/v1/topics/{topic}/acks", {"acks": acks},
                                 idempotent=True)["results"])

    def nack(self, topic: str, message: JSON, delay_ms: int | None = None,
             error: str | None = None) -> None:
        body: JSON = {"lease_token": message["lease"]["token"]}
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        if error is not None:
            body["error"] = error[:1000]
        self.request("POST", f"/v1/topics/{topic}/messages/{message['id']}/nack", body)

    def extend(self, topic: str, message: JSON, lease_seconds: int) -> JSON:
        return dict(self.request(
            "POST", f"/v1/topics/{topic}/messages/{message['id']}/extend",
            {"lease_token": message["lease"]["token"], "lease_seconds": lease_seconds},
            idempotent=True))

    def dead_letters(self, topic: str, limit: int = 50) -> list[JSON]:
        """The topic's dead messages, most recently dead first, with their last_error."""
        return list(self.request("GET", f"/v1/topics/{topic}/dead-letters?limit={limit}")[
            "messages"])

    def retry(self, topic: str, message_id: str) -> JSON:
        """Bring a dead message back: scheduled, due now, attempts from 0."""
        return dict(self.request("POST", f"/v1/topics/{topic}/messages/{message_id}/retry"))

    def lag(self, topic: str, minutes: int = 60) -> list[JSON]:
        """Delivery lag per minute of the last `minutes`: count, p50_ms, p99_ms, max_ms."""
        return list(self.request("GET", f"/v1/topics/{topic}/lag?minutes={minutes}")[
            "minutes"])

    # campaigns
    def campaign(self, topic: str, name: str) -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}/campaigns/{name}"))

    def campaigns(self, topic: str) -> list[JSON]:
        return list(self.request("GET", f"/v1/topics/{topic}/campaigns")["campaigns"])

    def control_campaign(self, topic: str, name: str, **controls: Any) -> JSON:
        """paused=True/False and/or max_per_second=N or None."""
        return dict(self.request("PATCH", f"/v1/topics/{topic}/campaigns/{name}", controls,
                                 idempotent=True))

    def shift_campaign(self, topic: str, name: str, shift_ms: int) -> JSON:
        """Starts the shift; the answer names its operation (see operation())."""
        return dict(self.request("PATCH", f"/v1/topics/{topic}/campaigns/{name}",
                                 {"shift_ms": shift_ms}))

    def cancel_campaign(self, topic: str, name: str) -> JSON:
        return dict(self.request("DELETE", f"/v1/topics/{topic}/campaigns/{name}"))

    def operation(self, topic: str, operation_id: str) -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}/operations/{operation_id}"))

    # schedules
    def put_schedule(self, topic: str, name: str, cron: str, payload: Any,
                     **fields: Any) -> JSON:
        return dict(self.request("PUT", f"/v1/topics/{topic}/schedules/{name}",
                                 {"cron": cron, "payload": payload, **fields}))

    def schedule(self, topic: str, name: str) -> JSON:
        return dict(self.request("GET", f"/v1/topics/{topic}/schedules/{name}"))

    def schedules(self, topic: str) -> list[JSON]:
        return list(self.request("GET", f"/v1/topics/{topic}/schedules")["schedules"])

    def delete_schedule(self, topic: str, name: str) -> None:
        self.request("DELETE", f"/v1/topics/{topic}/schedules/{name}")


def _answer(answer: urllib3.BaseHTTPResponse) -> Any:
    """The JSON of a 2xx answer (None when empty); ApiError for the others."""
    if answer.status >= 400:
        try:
            problem = json.loads(answer.data)
        except ValueError:
            problem = {"detail": answer.data[:200].decode(errors="replace")}
        raise ApiError(answer.status, problem if isinstance(problem, dict)
                       else {"detail": str(problem)[:200]})
    return json.loads(answer.data) if answer.data else None


class Consumer:
    """Runs handler(message) for the messages of a pull topic on `concurrency` threads, each
    leasing up to `batch` at a time with long polls and handling them in turn. A message is
    acked when its handler returns and nacked (with the exception as last_error) when it
    raises. Every half lease_seconds, each thread extends by lease_seconds the leases of its
    batch not yet acked or nacked, those waiting for their turn too. At least once: a
    process that dies mid-batch leaves the leases to expire, and the messages come again."""

    def __init__(self, client: Client, topic: str, handler: Callable[[JSON], None],
                 concurrency: int = 4, batch: int = 10, lease_seconds: int = 30,
                 wait_ms: int = 20_000) -> None:
        self.client, self.topic, self.handler = client, topic, handler
        self.concurrency, self.batch = concurrency, batch
        self.lease_seconds, self.wait_ms = lease_seconds, wait_ms
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Consumer:
        for n in range(self.concurrency):
            thread = threading.Thread(target=self._work, name=f"duetime-consumer-{n}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Lease nothing more; return once the messages in hand are handled (a long poll in
        flight ends within wait_ms)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self.client.lease(self.topic, self.batch, self.wait_ms,
                                             lease_seconds=self.lease_seconds)
            except (ApiError, OSError) as exc:
                log.warning("lease failed: %s", exc)
                self._stop.wait(1.0)
                continue
            if messages:
                self._handle_batch(messages)

    def _handle_batch(self, messages: list[JSON]) -> None:
        in_hand = {m["id"]: m for m in messages}
        lock, done = threading.Lock(), threading.Event()
        keeper = threading.Thread(target=self._keep_leased, args=(in_hand, lock, done),
                                  daemon=True)
        keeper.start()
        try:
            for message in messages:
                failure = self._handle(message)
                with lock:  # no extension races the ack or nack
                    in_hand.pop(message["id"], None)
                if failure is None:
                    self._settle(functools.partial(self.client.ack, self.topic, message))
                else:
                    self._settle(functools.partial(self.client.nack, self.topic, message,
                                                   error=failure))
        finally:
            done.set()
            keeper.join()

    def _handle(self, message: JSON) -> str | None:
        """Run the handler; None when it returned, else what it raised."""
        try:
            self.handler(message)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _keep_leased(self, in_hand: dict[str, JSON], lock: threading.Lock,
                     done: threading.Event) -> None:
        """Extend the leases of the batch's messages still in hand every half lease, until
        done; one whose extension fails is left to its lease (it may come again)."""
        while not done.wait(self.lease_seconds / 2):
            with lock:
                held = list(in_hand.values())
            for message in held:
                try:
                    self.client.extend(self.topic, message, self.lease_seconds)
                except (ApiError, OSError) as exc:
                    log.warning("extending %s failed: %s", message["id"], exc)
                    with lock:
                        in_hand.pop(message["id"], None)

    @staticmethod
    def _settle(call: Callable[[], None]) -> None:
        try:
            call()
        except (ApiError, OSError) as exc:  # the lease will expire
            log.warning("ack/nack failed: %s", exc)


WEBHOOK_TOLERANCE_S = 300  # Standard Webhooks' default: 5 minutes either side


def _key_of(secret: str) -> bytes:
    """A signing secret's HMAC key: base64 after `whsec_`; a plain (older) secret's UTF-8."""
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_"):] + "==")
    return secret.encode()


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes,
                   tolerance_s: float = WEBHOOK_TOLERANCE_S, now_s: float | None = None
                   ) -> bool:
    """True when the POST's headers (any case) carry a Standard Webhooks signature of body
    under secret (the topic's signing_secret) and its webhook-timestamp is within
    tolerance_s seconds of now_s (default: this clock): a POST captured and sent again
    later is refused. Constant-time comparison."""
    lower = {k.lower(): v for k, v in headers.items()}
    message_id, stamp = lower.get("webhook-id"), lower.get("webhook-timestamp", "")
    signatures = lower.get("webhook-signature", "")
    if not message_id or not stamp.isdigit() or not signatures:
        return False
    if abs((time.time() if now_s is None else now_s) - int(stamp)) > tolerance_s:
        return False
    try:
        key = _key_of(secret)
    except (binascii.Error, ValueError):
        return False
    expected = base64.b64encode(hmac.new(
        key, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()).decode()
    return any(version == "v1" and hmac.compare_digest(expected, given)
               for version, _, given in (s.partition(",") for s in signatures.split()))


def verify_signature(secret: str, body: bytes, signature: str | None) -> bool:
    """Deprecated (replayable: use verify_webhook): True when signature (the
    Duetime-Signature header) is the HMAC-SHA256 of body under the topic's signing_secret
    (constant-time comparison)."""
    if not signature:
        return False
    expected = hmac.new(_key_of(secret), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


class SignatureCheck:
    """WSGI middleware: answers 401 to a POST whose Standard Webhooks signature does not
    verify under secret or whose timestamp is outside tolerance_s (verify_webhook), and
    passes the others to app with the body intact. Works for Flask (app.wsgi_app =
    SignatureCheck(app.wsgi_app, secret)) and any WSGI app."""

    def __init__(self, app: Callable[..., Iterable[bytes]], secret: str,
                 tolerance_s: float = WEBHOOK_TOLERANCE_S) -> None:
        self.app, self.secret, self.tolerance_s = app, secret, tolerance_s

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            headers = {name: environ.get(f"HTTP_{name.upper().replace('-', '_')}", "")
                       for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
            if not verify_webhook(self.secret, headers, body, self.tolerance_s):
                start_response("401 Unauthorized", [("Content-Type", "text/plain")])
                return [b"bad signature\n"]
        return self.app(environ, start_response)
