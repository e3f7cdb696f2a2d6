"""A Python client of the duetime HTTP API (`pip install ./clients/python`, then
`from duetime_client import Client`).

- Client: one typed call per route. Answers are the API's JSON as dicts; an error answer
  raises ApiError with its problem+json. Topic names and ids go into paths percent-encoded.
  429 and 503 are retried with exponential backoff and jitter (the answer's Retry-After,
  in seconds or as an HTTP date, when it gives one), `retries` times. A connection that could not
  be opened is retried for every call (the request never left); one cut after the request
  was sent only for idempotent calls (GET, PUT, DELETE, and enqueues that carry an id).
  No answer at all raises ApiUnreachable (a ConnectionError) or ApiTimeout (a TimeoutError).
- Consumer: lease → handler → ack on threads of its own; an exception in the handler nacks
  the message with the error; a handler that runs long has its lease extended; stop()
  returns once the messages in hand are finished, abandoning a long poll in flight.
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
import contextlib
import copy
import email.utils
import functools
import hashlib
import hmac
import io
import json
import logging
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as NoAnswerInTime

JSON = dict[str, Any]
RETRIED_STATUSES = (429, 503)
STOP_POLL_S = 0.1  # how often Consumer.stop() cuts the polls again while a thread lives
log = logging.getLogger("duetime.client")


def _seg(value: str) -> str:
    """One path segment: every reserved character percent-encoded, so an id holding `/`,
    `?`, `#` or `%`, or one that is `.` or `..`, stays in its segment (and gets the API's
    own answer about it)."""
    segment = quote(str(value), safe="")
    # "." and ".." are dot segments, which URL parsers remove (".." would reach the parent):
    # encoded, they reach the API, which refuses them as ids
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def retry_after_s(hint: str, now_s: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date; None when
    absent or unreadable."""
    hint = hint.strip()
    if hint.isdigit():
        return float(hint)
    try:
        when = email.utils.parsedate_to_datetime(hint)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:  # RFC 9110 dates are GMT; none other is valid
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def backoff_pause_s(backoff_s: float, attempt: int) -> float:
    """The pause before retry `attempt` (0 first): backoff_s * 2**attempt plus a random
    share of up to half of that, so clients turned away together do not come back
    together."""
    base = backoff_s * 2 ** attempt
    return base + random.uniform(0, base / 2)


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
    finding none idle opens one more, closed after its call). A context manager: leaving
    the `with` block closes the connections."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 40.0,
                 retries: int = 5, backoff_s: float = 0.2, connections: int = 32) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._prefix = urlsplit(self.base_url).path
        self._pool = self._new_pool(connections)
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._json_headers = {**self._headers, "Content-Type": "application/json"}

    def _new_pool(self, connections: int) -> urllib3.HTTPConnectionPool:
        return urllib3.connection_from_url(
            self.base_url, maxsize=connections, block=False,
            timeout=urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s))

    def close(self) -> None:
        """Close the kept-alive connections (the next call opens new ones)."""
        self._pool.close()

    def _cuttable(self, connections: int) -> tuple[Client, Callable[[], None]]:
        """A client like this one on connections of its own, and a function that cuts all
        of them at once: a call waiting on one (a long poll) ends with ApiUnreachable."""
        twin = copy.copy(self)
        twin._pool = self._new_pool(connections)
        opened: weakref.WeakSet[Any] = weakref.WeakSet()

        def connect(conn: Any) -> None:
            base.connect(conn)
            opened.add(conn)

        base = twin._pool.ConnectionCls
        twin._pool.ConnectionCls = type("Cuttable" + base.__name__, (base,),
                                        {"connect": connect})

        def cut() -> None:
            for conn in list(opened):
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        return twin, cut

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def request(self, method: str, path: str, body: JSON | None = None,
                idempotent: bool | None = None) -> Any:
        """One call; the JSON answer (None for 204). Retries as the module says."""
        idempotent = method in ("GET", "PUT", "DELETE") if idempotent is None else idempotent
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers if data is None else self._json_headers
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            pause_s = backoff_pause_s(self.backoff_s, attempt)
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
                hinted = retry_after_s(answer.headers.get("Retry-After", ""))
                pause_s = pause_s if hinted is None else hinted
            time.sleep(pause_s)
        raise AssertionError("unreachable")

    # operations
    def healthz(self) -> JSON:
        """The process is up (says nothing about Cassandra)."""
        return dict(self.request("GET", "/healthz"))

    def readyz(self) -> JSON:
        """Ready: Cassandra answers, the schema is current (ApiError 503 otherwise)."""
        return dict(self.request("GET", "/readyz"))

    # topics
    def put_topic(self, topic: str, **settings: Any) -> JSON:
        return dict(self.request("PUT", _topic(topic), settings))

    def get_topic(self, topic: str) -> JSON:
        return dict(self.request("GET", _topic(topic)))

    def list_topics(self) -> list[JSON]:
        return list(self.request("GET", "/v1/topics")["topics"])

    def delete_topic(self, topic: str) -> None:
        self.request("DELETE", _topic(topic))

    def rotate_signing_secret(self, topic: str, overlap_seconds: int | None = None) -> JSON:
        """A new webhook signing secret; the old one signs beside it for overlap_seconds
        (the API's default: a day). The topic with its new secret."""
        body = {} if overlap_seconds is None else {"overlap_seconds": overlap_seconds}
        return dict(self.request("POST", _topic(topic, "/signing-secret:rotate"), body))

    def stats(self, topic: str, window: str = "minute") -> JSON:
        return dict(self.request("GET", _topic(topic, "/stats", query={"window": window})))

    # messages
    def enqueue(self, topic: str, payload: Any, **fields: Any) -> JSON:
        """One message: payload and any of id, deliver_at, delay_ms, local_time, timezone,
        priority, campaign, group. Retried on a lost connection only when it has an id."""
        return dict(self.request("POST", _topic(topic, "/messages"),
                                 {"payload": payload, **fields},
                                 idempotent="id" in fields))

    def enqueue_batch(self, topic: str, messages: list[JSON]) -> list[JSON]:
        """Up to 1,000 messages; a result per message, in order."""
        return list(self.request("POST", _topic(topic, "/messages:batch"),
                                 {"messages": messages},
                                 idempotent=all("id" in m for m in messages))["results"])

    def get(self, topic: str, message_id: str) -> JSON:
        return dict(self.request("GET", _topic(topic, "/messages/{}", message_id)))

    def cancel(self, topic: str, message_id: str) -> None:
        self.request("DELETE", _topic(topic, "/messages/{}", message_id))

    def reschedule(self, topic: str, message_id: str, **when: Any) -> JSON:
        """deliver_at=... or delay_ms=..."""
        return dict(self.request("PATCH", _topic(topic, "/messages/{}", message_id), when,
                                 idempotent=True))

    # consuming
    def lease(self, topic: str, max_messages: int = 10, wait_ms: int = 0,
              **options: Any) -> list[JSON]:
        """Leased messages (lease_seconds, consumer optional), each with lease.token."""
        return list(self.request("POST", _topic(topic, "/leases"),
                                 {"max": max_messages, "wait_ms": wait_ms, **options})["messages"])

    def ack(self, topic: str, message: JSON) -> None:
        self.request("POST", _topic(topic, "/messages/{}/ack", message["id"]),
                     {"lease_token": message["lease"]["token"]}, idempotent=True)

    def ack_many(self, topic: str, messages: Iterable[JSON]) -> list[JSON]:
        acks = [{"id": m["id"], "lease_token": m["lease"]["token"]} for m in messages]
        return list(self.request("POST", _topic(topic, "/acks"), {"acks": acks},
                                 idempotent=True)["results"])

    def nack(self, topic: str, message: JSON, delay_ms: int | None = None,
             error: str | None = None) -> None:
        body: JSON = {"lease_token": message["lease"]["token"]}
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        if error is not None:
            body["error"] = error[:1000]
        self.request("POST", _topic(topic, "/messages/{}/nack", message["id"]), body)

    def extend(self, topic: str, message: JSON, lease_seconds: int) -> JSON:
        return dict(self.request(
            "POST", _topic(topic, "/messages/{}/extend", message["id"]),
            {"lease_token": message["lease"]["token"], "lease_seconds": lease_seconds},
            idempotent=True))

    def search_messages(self, topic: str, limit: int = 100, page_token: str | None = None,
                        **filters: Any) -> JSON:
        """One page of the topic's messages that match every filter given: state, campaign,
        recipient, label ("key:value", or a list of them, each required), due_from and
        due_to (RFC 3339 or epoch ms; due_from <= deliver_at < due_to). The answer:
        {messages (without payloads), next_page_token (None on the last page)}."""
        query = {k: v for k, v in filters.items() if v is not None}
        query["limit"] = limit
        if page_token is not None:
            query["page_token"] = page_token
        return dict(self.request("GET", _topic(topic, "/messages", query=query)))

    def iter_messages(self, topic: str, page_size: int = 100, **filters: Any) -> Iterator[JSON]:
        """Every matching message (search_messages' filters), page after page, each once."""
        token = None
        while True:
            page = self.search_messages(topic, page_size, token, **filters)
            yield from page["messages"]
            token = page["next_page_token"]
            if token is None:
                return

    def dead_letters(self, topic: str, limit: int = 50) -> list[JSON]:
        """The topic's dead messages, most recently dead first, with their last_error."""
        return list(self.request("GET", _topic(topic, "/dead-letters", query={"limit": limit}))[
            "messages"])

    def retry(self, topic: str, message_id: str) -> JSON:
        """Bring a dead message back: scheduled, due now, attempts from 0."""
        return dict(self.request("POST", _topic(topic, "/messages/{}/retry", message_id)))

    def lag(self, topic: str, minutes: int = 60) -> list[JSON]:
        """Delivery lag per minute of the last `minutes`: count, p50_ms, p99_ms, max_ms."""
        return list(self.request("GET", _topic(topic, "/lag", query={"minutes": minutes}))[
            "minutes"])

    # campaigns
    def campaign(self, topic: str, name: str) -> JSON:
        return dict(self.request("GET", _topic(topic, "/campaigns/{}", name)))

    def campaigns(self, topic: str) -> list[JSON]:
        return list(self.request("GET", _topic(topic, "/campaigns"))["campaigns"])

    def control_campaign(self, topic: str, name: str, **controls: Any) -> JSON:
        """paused=True/False and/or max_per_second=N or None."""
        return dict(self.request("PATCH", _topic(topic, "/campaigns/{}", name), controls,
                                 idempotent=True))

    def shift_campaign(self, topic: str, name: str, shift_ms: int) -> JSON:
        """Starts the shift; the answer names its operation (see operation())."""
        return dict(self.request("PATCH", _topic(topic, "/campaigns/{}", name),
                                 {"shift_ms": shift_ms}))

    def cancel_campaign(self, topic: str, name: str) -> JSON:
        return dict(self.request("DELETE", _topic(topic, "/campaigns/{}", name)))

    def operation(self, topic: str, operation_id: str) -> JSON:
        return dict(self.request("GET", _topic(topic, "/operations/{}", operation_id)))

    # operations on the messages a filter matches
    def start_operation(self, topic: str, kind: str, shift_ms: int | None = None,
                        **filters: Any) -> JSON:
        """Start kind ("cancel", "shift" with shift_ms, "pause" or "resume") on the messages
        matching every filter given (search_messages' filters; label "key:value" or a list
        of them); a pause or resume of a campaign alone sets that campaign's flag. The
        answer is {operation}; follow it with operation()."""
        flt = {k: v for k, v in filters.items() if v is not None}
        if isinstance(flt.get("label"), str):
            flt["label"] = [flt["label"]]
        body: dict[str, Any] = {"kind": kind, "filter": flt}
        if shift_ms is not None:
            body["shift_ms"] = shift_ms
        return dict(self.request("POST", _topic(topic, "/operations"), body))

    # schedules
    def put_schedule(self, topic: str, name: str, cron: str, payload: Any,
                     **fields: Any) -> JSON:
        return dict(self.request("PUT", _topic(topic, "/schedules/{}", name),
                                 {"cron": cron, "payload": payload, **fields}))

    def schedule(self, topic: str, name: str) -> JSON:
        return dict(self.request("GET", _topic(topic, "/schedules/{}", name)))

    def schedules(self, topic: str) -> list[JSON]:
        return list(self.request("GET", _topic(topic, "/schedules"))["schedules"])

    def delete_schedule(self, topic: str, name: str) -> None:
        self.request("DELETE", _topic(topic, "/schedules/{}", name))


def _topic(topic: str, route: str = "", *ids: str,
           query: Mapping[str, Any] | None = None) -> str:
    """/v1/topics/TOPIC then route with each `{}` replaced by the next of ids, every name
    and id percent-encoded (route's own words, like `messages:batch`, as they are)."""
    path = f"/v1/topics/{_seg(topic)}" + route.format(*(_seg(i) for i in ids))
    return f"{path}?{urlencode(query, doseq=True)}" if query else path


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
        self._batches = threading.Condition()  # guards _handling
        self._handling = 0  # batches being handled now

    def start(self) -> Consumer:
        # the long polls on connections of their own, which stop() cuts
        self._poller, self._cut_polls = self.client._cuttable(self.concurrency)
        for n in range(self.concurrency):
            thread = threading.Thread(target=self._work, name=f"duetime-consumer-{n}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float | None = None) -> bool:
        """Lease nothing more; return once the messages in hand are handled and settled and
        the threads ended, or timeout_s passed (False then). A long poll in flight is cut,
        not waited for: messages it was leasing come again when their lease expires."""
        if not self._threads:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._batches:
            self._stop.set()
            if not self._batches.wait_for(lambda: self._handling == 0, timeout_s):
                return False
        while any(t.is_alive() for t in self._threads):
            self._cut_polls()  # again: a thread may have begun a poll as stop began
            for thread in self._threads:
                thread.join(STOP_POLL_S)
            if deadline is not None and time.monotonic() > deadline:
                return False
        self._poller.close()
        return True

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._poller.lease(self.topic, self.batch, self.wait_ms,
                                              lease_seconds=self.lease_seconds)
            except (ApiError, OSError) as exc:
                if not self._stop.is_set():  # else: cut by stop()
                    log.warning("lease failed: %s", exc)
                self._stop.wait(1.0)
                continue
            with self._batches:
                if self._stop.is_set() or not messages:
                    continue
                self._handling += 1
            try:
                self._handle_batch(messages)
            finally:
                with self._batches:
                    self._handling -= 1
                    self._batches.notify_all()

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
