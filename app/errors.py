"""Domain errors. Each names the HTTP status and problem type it maps to; app.api.problems is
the one place that turns them into application/problem+json answers."""

from __future__ import annotations

from typing import Any


class DuetimeError(Exception):
    """Base of every expected failure. detail is safe to show to the client."""

    status = 500
    title = "Internal error"
    slug = "internal"

    def __init__(self, detail: str, errors: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors


class InvalidInput(DuetimeError):
    """The request is well-formed JSON but a field is wrong (400, names the field)."""

    status, title, slug = 400, "Invalid request", "invalid-request"


class PayloadTooLarge(DuetimeError):
    status, title, slug = 413, "Payload too large", "payload-too-large"


class Unauthorized(DuetimeError):
    status, title, slug = 401, "Unauthorized", "unauthorized"


class NotFound(DuetimeError):
    status, title, slug = 404, "Not found", "not-found"


class Conflict(DuetimeError):
    """The resource is in a state that refuses this change (409)."""

    status, title, slug = 409, "Conflict", "conflict"


class LeaseLost(Conflict):
    """The lease token no longer holds the message (expired, taken over, or acked)."""

    title, slug = "Lease lost", "lease-lost"


class RateLimited(DuetimeError):
    status, title, slug = 429, "Too many requests", "rate-limited"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class StoreUnavailable(DuetimeError):
    """Cassandra cannot be reached or did not answer in time (503, retry later)."""

    status, title, slug = 503, "Service unavailable", "unavailable"
    retry_after_s = 2


class Overloaded(StoreUnavailable):
    """This API process is behind: the request waited longer than DUETIME_SHED_QUEUE_MS for
    a thread, so it is refused at once rather than served late (503, retry a moment later)."""

    title, slug = "Overloaded", "overloaded"
    retry_after_s = 1


class NoReleaser(StoreUnavailable):
    """No releaser owning the topic's shards could be reached within the call's wait: pull
    leases are served by them (workers.broker). 503 until one runs or takes the slots over."""

    title, slug = "No releaser", "no-releaser"
    retry_after_s = 1


class SchemaBehind(StoreUnavailable):
    """The keyspace lacks migrations this code needs (run `duetime-admin schema apply`)."""

    title, slug = "Schema not current", "schema-behind"


class ClockSkewed(StoreUnavailable):
    """This process's clock is further from Cassandra's than DUETIME_SAFETY_LAG_MS: it could
    hand messages out early (503 until NTP mends it)."""

    title, slug = "Clock skewed", "clock-skewed"
    retry_after_s = 10


class UnsupportedMediaType(DuetimeError):
    """A body sent as something other than what the route reads (JSON): 415."""

    status, title, slug = 415, "Unsupported media type", "unsupported-media-type"
