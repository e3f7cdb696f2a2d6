"""Configuration: defaults, the DUETIME_* environment, validation. The only reader of os.environ.

Every setting has a default that works against the local dev node; see the README's table.
Units are in the names: *_ms milliseconds, *_s seconds, *_bytes bytes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from app.core.timeline import COUNTED_AHEAD_MS, MAX_HORIZON_DAYS
from app.delivery.webhook_targets import parse_allow


class ConfigError(ValueError):
    """A DUETIME_* setting is malformed; the message names the variable and what it expects."""


@dataclasses.dataclass(frozen=True)
class Config:
    """All settings of a duetime process (API, releaser, CLI, Spark job)."""

    contact_points: tuple[str, ...] = ("127.0.0.1",)
    cql_port: int = 9042
    keyspace: str = "duetime"
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    local_dc: str | None = None
    consistency: str = "LOCAL_QUORUM"
    serial_consistency: str = "LOCAL_SERIAL"
    cql_username: str | None = None
    cql_password: str | None = None
    request_timeout_s: float = 10.0

    http_host: str = "127.0.0.1"
    http_port: int = 8080
    # where the API's gunicorn master serves its workers' Prometheus /metrics (0: none); not
    # the API port, which tenants reach (app.gunicorn_conf)
    api_metrics_port: int = 9463
    max_payload_bytes: int = 64 * 1024
    max_batch: int = 1000
    # how far ahead a message sits on the timeline; one asking for later (an enqueue, a move,
    # a shift) is parked there (app.core.timeline.parked_ms)
    horizon_days: int = 365
    max_wait_ms: int = 30_000
    # lease calls one API process holds waiting (long polls), in all and per tenant: each
    # holds a request thread (app.delivery.waits); past them 503 and 429, with Retry-After
    api_waits: int = 1000
    api_waits_per_tenant: int = 250
    min_lease_s: int = 1
    max_lease_s: int = 12 * 3600
    key_cache_s: float = 30.0
    shed_queue_ms: int = 1000  # a /v1 request that waited longer for a thread: 503 (0: never)
    rate_limit_per_s: float = 0.0  # requests a second per tenant (0: no quota)
    rate_burst: int = 0
    message_rate_limit_per_s: float = 0.0  # messages enqueued a second per tenant (0: none)
    message_rate_burst: int = 0
    # a long poll parked at its releaser (workers.broker) with nothing due looks again this
    # often when no wake-up (app.delivery.wakeups.due_kind) comes
    pull_idle_ms: int = 1000

    bucket_ms: int = 60_000
    partition_cap: int = 1000
    slot_chunk: int = 256
    safety_lag_ms: int = 1000
    retention_days: int = 7
    # fault injection only (make faults): this process's clock runs this far off the host's
    clock_offset_ms: int = 0

    release_ring: int = 0
    release_slots: int = 32
    release_lease_ms: int = 5000
    release_lookahead_ms: int = 5000
    release_rescan_ms: int = 50
    # without a wake-up (app.delivery.wakeups), the walk reads this often; woken, every rescan
    release_idle_ms: int = 2000
    topic_refresh_ms: int = 60_000
    webhook_concurrency: int = 64
    webhook_allow: str = ""  # networks webhooks may reach although not public (comma list)
    releaser_metrics_port: int = 9464  # a releaser's Prometheus /metrics (0: none)
    wake_port: int = 0  # the UDP port a releaser is woken on (0: any free one)
    wake_host: str = ""  # the address other processes wake a releaser at ("": its host's)

    def replace(self, **changes: Any) -> Config:
        """A copy with some settings changed (tests, CLI flags)."""
        return dataclasses.replace(self, **changes)


_CONSISTENCIES = {
    "ONE", "TWO", "THREE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL", "LOCAL_ONE",
}
_SERIALS = {"SERIAL", "LOCAL_SERIAL"}


def _convert(name: str, raw: str, default: Any) -> Any:
    kind = type(default) if default is not None else str
    try:
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if kind is bool:
            return raw.lower() in {"1", "true", "yes", "on"}
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"DUETIME_{name.upper()}={raw!r}: expected {kind.__name__}") from exc


def _validate(config: Config) -> None:
    if config.consistency not in _CONSISTENCIES:
        raise ConfigError(f"DUETIME_CONSISTENCY must be one of {sorted(_CONSISTENCIES)}")
    if config.serial_consistency not in _SERIALS:
        raise ConfigError(f"DUETIME_SERIAL_CONSISTENCY must be one of {sorted(_SERIALS)}")
    if not config.contact_points:
        raise ConfigError("DUETIME_CONTACT_POINTS must name at least one host")
    _validate_signs(config)
    _validate_release(config)
    if not 0 <= config.wake_port <= 65535:
        raise ConfigError("DUETIME_WAKE_PORT must be from 0 (any free port) to 65535")
    if not 50 <= config.pull_idle_ms <= 60_000:
        raise ConfigError("DUETIME_PULL_IDLE_MS must be from 50 to 60000")
    if not 1 <= config.min_lease_s <= config.max_lease_s:
        raise ConfigError("DUETIME_MIN_LEASE_S must be >= 1 and <= DUETIME_MAX_LEASE_S")
    if not 1 <= config.horizon_days <= MAX_HORIZON_DAYS:
        raise ConfigError(f"DUETIME_HORIZON_DAYS must be from 1 to {MAX_HORIZON_DAYS}")
    _validate_texts(config)


def _validate_signs(config: Config) -> None:
    """Counts, sizes and periods that must be above 0, and those that may be 0."""
    positive = ("bucket_ms", "partition_cap", "slot_chunk", "max_batch", "max_payload_bytes",
                "release_slots", "release_lease_ms", "release_lookahead_ms", "release_rescan_ms",
                "release_idle_ms", "topic_refresh_ms", "webhook_concurrency", "api_waits",
                "api_waits_per_tenant", "request_timeout_s",
                # a row lives its due time plus the retention: with none it could be gone
                # before its take
                "retention_days")
    for name in positive:
        if not getattr(config, name) > 0:  # NaN too
            raise ConfigError(f"DUETIME_{name.upper()} must be > 0")
    # a negative safety lag would walk ahead of pointers still being written
    not_negative = ("safety_lag_ms", "max_wait_ms", "key_cache_s", "rate_limit_per_s",
                    "rate_burst", "message_rate_limit_per_s", "message_rate_burst")
    for name in not_negative:
        if not getattr(config, name) >= 0:
            raise ConfigError(f"DUETIME_{name.upper()} must be >= 0")


def _validate_release(config: Config) -> None:
    """The look-ahead must reach past what it runs for: two rescans (woken) or one idle
    period (not woken), and stay within what write counts cover."""
    reach = max(2 * config.release_rescan_ms, config.release_idle_ms)
    if config.release_lookahead_ms < reach:
        raise ConfigError("DUETIME_RELEASE_LOOKAHEAD_MS must be at least the larger of 2 x "
                          "DUETIME_RELEASE_RESCAN_MS and DUETIME_RELEASE_IDLE_MS")
    if config.release_lookahead_ms + config.safety_lag_ms > COUNTED_AHEAD_MS:
        raise ConfigError(f"DUETIME_RELEASE_LOOKAHEAD_MS + DUETIME_SAFETY_LAG_MS must be at "
                          f"most {COUNTED_AHEAD_MS}")


def _validate_texts(config: Config) -> None:
    try:
        parse_allow(config.webhook_allow)
    except ValueError as exc:
        raise ConfigError(f"DUETIME_WEBHOOK_ALLOW: {exc}") from exc
    if not config.keyspace.replace("_", "").isalnum():
        raise ConfigError("DUETIME_KEYSPACE must be letters, digits and underscores")


def load_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build the configuration from DUETIME_* variables (and explicit overrides), validated."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(Config):
        raw = environ.get(f"DUETIME_{field.name.upper()}")
        if raw is not None and raw != "":
            values[field.name] = _convert(field.name, raw, field.default)
    values.update(overrides)
    config = Config(**values)
    _validate(config)
    return config
