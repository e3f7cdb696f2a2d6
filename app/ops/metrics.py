"""Prometheus metrics of one process (API worker or releaser), named after Prometheus
conventions: seconds, `_total` counters, base units.

Every process records into prometheus_client's default registry. gunicorn workers set
PROMETHEUS_MULTIPROC_DIR (app.gunicorn_conf), so each writes its values to files there and
the gunicorn master adds up all workers (multiprocess mode) on a port of its own
(DUETIME_API_METRICS_PORT), not the API's; a releaser serves its own on another
(workers.releaser, DUETIME_RELEASER_METRICS_PORT).

Label cardinality is bounded: `tenant` and `topic` label the message counters, and a process
gives its first MAX_TOPIC_SERIES (tenant, topic) pairs a series each; later pairs share the
topic label `_other` of their tenant, and tenants past MAX_TENANT_SERIES share the tenant
label `_other` too. Every other label takes a fixed, documented set of values.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

MAX_TOPIC_SERIES = int(os.environ.get("DUETIME_METRICS_MAX_TOPICS", "1000"))
MAX_TENANT_SERIES = int(os.environ.get("DUETIME_METRICS_MAX_TENANTS", "100"))
OTHER = "_other"
# 1 ms .. 60 s: the lags duetime promises (a few ms) and the ones an outage makes
LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 30.0, 60.0)
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0, 30.0)
PACING_BUCKETS_S = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0,
                    24 * 3600.0)

_MESSAGE_LABELS = ("tenant", "topic")
MESSAGES_ENQUEUED = Counter(
    "duetime_messages_enqueued_total", "Messages accepted onto a timeline (new ids only).",
    _MESSAGE_LABELS)
MESSAGES_DELIVERED = Counter(
    "duetime_messages_delivered_total",
    "Messages delivered: acknowledged by a pull consumer or answered 2xx by a webhook.",
    _MESSAGE_LABELS)
MESSAGES_DEAD = Counter(
    "duetime_messages_dead_total", "Messages made dead (attempts exhausted, or nacked dead).",
    _MESSAGE_LABELS)
MESSAGES_CANCELLED = Counter(
    "duetime_messages_cancelled_total",
    "Messages cancelled (by id, by a campaign cancel, or by deleting their schedule).",
    _MESSAGE_LABELS)
DELIVERY_LAG = Histogram(
    "duetime_delivery_lag_seconds",
    "How long after the moment a message was due to be handed out it was: leased to a pull "
    "consumer (mode=pull) or its POST started (mode=push). A paced message is due at its "
    "delivery slot, so its wait for its turn is not lag (see duetime_pacing_wait_seconds).",
    ("mode",), buckets=LAG_BUCKETS_S)
PACING_WAIT = Histogram(
    "duetime_pacing_wait_seconds",
    "How long a paced campaign's message waited for its turn: its delivery slot (or its own "
    "due time, when its slot had already come) less its deliver_at. One per lease.",
    buckets=PACING_BUCKETS_S)
HTTP_DURATION = Histogram(
    "duetime_http_request_duration_seconds",
    "API request latency by route (the Flask endpoint, e.g. messages.Enqueue) and status "
    "class (2xx, 4xx, 5xx).", ("endpoint", "method", "status"), buckets=LATENCY_BUCKETS_S)
CASSANDRA_DURATION = Histogram(
    "duetime_cassandra_request_duration_seconds",
    "Cassandra request latency as the driver saw it (one statement or batch).",
    buckets=LATENCY_BUCKETS_S)
CASSANDRA_ERRORS = Counter(
    "duetime_cassandra_request_errors_total",
    "Cassandra requests that failed, by the driver's exception class name.", ("error",))
CONDITIONAL_NOT_APPLIED = Counter(
    "duetime_conditional_writes_not_applied_total",
    "Lightweight transactions whose condition did not hold (another writer got there first).",
    ("table",))
WEBHOOK_ATTEMPTS = Counter(
    "duetime_webhook_attempts_total",
    "Webhook POSTs by outcome: success, http_4xx, http_5xx, timeout, connection_error, "
    "error.", ("outcome",))
RELEASER_STEP_DURATION = Histogram(
    "duetime_releaser_step_duration_seconds",
    "How long each run of a releaser's paced step took, by step (topics, walk, "
    "operations): what a step finds waits for its run to end, so a walk step longer "
    "than the look-ahead makes messages written a moment before their due time late.",
    ("step",),
    buckets=LATENCY_BUCKETS_S)
SLOTS_OWNED = Gauge(
    "duetime_release_slots_owned", "Release slots this releaser holds the lease of.",
    multiprocess_mode="livesum")
LEASE_WAITS = Gauge(
    "duetime_lease_waits", "Lease calls waiting for messages (long polls) in the API.",
    multiprocess_mode="livesum")
TIMERS_ARMED = Gauge(
    "duetime_timers_armed", "Messages leased for their POST (taken at their due time) whose "
    "outcome is not back yet, in this releaser.", multiprocess_mode="livesum")
CLOCK_SKEW = Gauge(
    "duetime_clock_skew_seconds",
    "This process's clock minus Cassandra's (positive: this clock is ahead), last measured.",
    multiprocess_mode="max")

REQUESTS_SHED = Counter(
    "duetime_requests_shed_total",
    "API requests answered 503 overloaded at once: they waited longer than "
    "DUETIME_SHED_QUEUE_MS for a thread (app.ops.shedding).")
WAKEUPS_SENT = Counter(
    "duetime_wakeups_sent_total",
    "Wake-ups this process sent to releasers (app.delivery.wakeups), by kind ('due': a "
    "topic written to, whichever topic).", ["kind"])
WAKEUPS_RECEIVED = Counter(
    "duetime_wakeups_received_total",
    "Wake-ups a releaser received (workers/wake_listener.py), by kind ('due': a topic "
    "written to, whichever topic).", ["kind"])
CLOCK_RELEASER_GAP = Gauge(
    "duetime_clock_releaser_gap_seconds",
    "This process's clock minus the live releaser's it is farthest from (each measured "
    "against Cassandra's); 0 when no other releaser reports.", multiprocess_mode="max")
GC_PAUSE = Histogram(
    "duetime_gc_pause_seconds",
    "How long each of Python's cyclic garbage collections stopped this process, by "
    "generation (0, 1, 2: a full one, whose length grows with the objects the process "
    "keeps). Every thread waits for it: a releaser's hand-outs come that much late.",
    ("generation",), buckets=LATENCY_BUCKETS_S)

_series_lock = threading.Lock()
_topic_series: set[tuple[str, str]] = set()
_tenant_series: set[str] = set()


def message_labels(tenant: str, topic: str) -> tuple[str, str]:
    """The (tenant, topic) labels this process uses for a topic's message counters: its own
    names while the process has room for them, `_other` past MAX_*_SERIES (bounded series)."""
    key = (tenant, topic)
    if key in _topic_series:
        return key
    with _series_lock:
        if tenant not in _tenant_series and len(_tenant_series) >= MAX_TENANT_SERIES:
            return OTHER, OTHER
        _tenant_series.add(tenant)
        if key not in _topic_series and len(_topic_series) >= MAX_TOPIC_SERIES:
            return tenant, OTHER
        _topic_series.add(key)
    return key


_COUNTER_OF_STATE = {"delivered": MESSAGES_DELIVERED, "dead": MESSAGES_DEAD,
                     "cancelled": MESSAGES_CANCELLED}


def count_transitions(tenant: str, topic: str,
                      moves: Iterable[tuple[str | None, str]]) -> None:
    """Count applied (before, after) state moves of a topic's messages: before None is an
    enqueue; into delivered, dead or cancelled an end. Other moves count nothing here."""
    totals: dict[Any, int] = {}
    for before, after in moves:
        if before == after:
            continue
        counter = MESSAGES_ENQUEUED if before is None else _COUNTER_OF_STATE.get(after)
        if counter is not None:
            totals[counter] = totals.get(counter, 0) + 1
    if totals:
        labels = message_labels(tenant, topic)
        for counter, n in totals.items():
            counter.labels(*labels).inc(n)


def observe_lags(mode: str, lags_ms: Iterable[int]) -> None:
    """Delivery lags in ms (negative ones, handed out ahead, count as 0)."""
    histogram = DELIVERY_LAG.labels(mode)
    for lag in lags_ms:
        histogram.observe(max(lag, 0) / 1000)


def webhook_outcome(error: str | None) -> str:
    """The outcome label of a POST from its recorded error (workers.webhook.post_outcome)."""
    if error is None:
        return "success"
    for prefix, outcome in (("HTTP 4", "http_4xx"), ("HTTP 5", "http_5xx"),
                            ("timeout", "timeout"), ("connection failed", "connection_error"),
                            ("TLS failed", "connection_error")):
        if error.startswith(prefix):
            return outcome
    return "error"


def on_cassandra_request(future: Any) -> None:
    """A driver request-init listener (Session.add_request_init_listener): times the request
    and counts its failure."""
    started = time.perf_counter()

    def done(_: Any) -> None:
        CASSANDRA_DURATION.observe(time.perf_counter() - started)

    def failed(exc: BaseException) -> None:
        CASSANDRA_DURATION.observe(time.perf_counter() - started)
        CASSANDRA_ERRORS.labels(type(exc).__name__).inc()

    future.add_callbacks(done, failed)


_gc_started = [0.0]
# (generation, seconds) of collections not observed yet: at most this many are kept
_gc_pauses: deque[tuple[int, float]] = deque(maxlen=10_000)


def _time_collection(phase: str, info: dict[str, int]) -> None:
    # Runs inside the collection, on whichever thread it interrupted: no metric here, since
    # that thread may hold the metrics' own locks (a new series' setup allocates, which may
    # start a collection), and taking them again would never return.
    now = time.perf_counter()
    if phase == "start":
        _gc_started[0] = now
    else:
        _gc_pauses.append((info["generation"], now - _gc_started[0]))


def time_collections() -> None:
    """Time every garbage collection of this process (once a process); flush_collections
    observes them into GC_PAUSE."""
    if _time_collection not in gc.callbacks:
        gc.callbacks.append(_time_collection)


def flush_collections() -> None:
    """Observe the collections timed since the last call into GC_PAUSE. Called where no
    metric lock is held: after each API request, at each releaser tick, before a scrape.
    Threads flush at once (a worker's request threads): each pops until the deque is empty,
    never asking first, since another may take the last one between the asking and the pop."""
    while True:
        try:
            generation, seconds = _gc_pauses.popleft()
        except IndexError:
            return
        GC_PAUSE.labels(str(generation)).observe(seconds)


def exposition() -> bytes:
    """The text exposition of this process's metrics, or of all gunicorn workers' when
    PROMETHEUS_MULTIPROC_DIR is set."""
    flush_collections()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest()
