"""Push delivery use cases: take due messages of a webhook topic, then record each POST's outcome.

The take is the same move on the timeline as a pull lease (pointer at the lease's expiry first,
then the LWT), so a releaser that dies mid-POST leaves a message that comes due again. It
happens at or after the due time, and the POST starts at once: a message is leased only once
its POST is under way. The lease outlives the POST's timeout by PUSH_LEASE_MARGIN_S, and a
releaser does not start a POST that could outlive its lease. The LWT on the leased version
fences every later transition.
"""

from __future__ import annotations

import dataclasses
import math
import random

from app.core.timeline import placement_ms, retry_backoff_ms, ttl_s
from app.delivery import frequency_caps, leasing
from app.delivery.scan import Due
from app.messages import dead_letters
from app.messages.send_windows import retry_due
from app.messages.transitions import count_moves, finished, place_then
from app.models import MessageState, Payload, Topic
from app.services import Services

PUSH_LEASE_MARGIN_S = 5
MAX_ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True)
class PushOutcome:
    """What one POST of a leased message came to: error None means the target answered 2xx."""

    row: MessageState
    error: str | None


def push_lease_s(topic: Topic) -> int:
    """Seconds a releaser holds a message while POSTing it: the timeout plus a margin."""
    return math.ceil(topic.settings.delivery_timeout_seconds) + PUSH_LEASE_MARGIN_S


def take_for_push(services: Services, topic: Topic, due: list[Due], consumer: str
                  ) -> list[tuple[MessageState, Payload | None]]:
    """Lease each message due now for its POST, which starts at once (dead instead past
    max_attempts). Returns the leased rows with their payloads (None when the payload is
    missing: the POST is then a failure)."""
    hold = leasing.Hold(push_lease_s(topic), consumer)
    return leasing.take_with_payloads(services, topic, due, services.clock(),
                                      [hold] * len(due))


def jittered_backoff_ms(attempt: int, topic: Topic, rng: random.Random) -> int:
    """The topic's exponential backoff after `attempt` failures, with equal jitter (half fixed,
    half uniform) so retries of a burst do not come back as one burst."""
    s = topic.settings
    base = retry_backoff_ms(attempt, s.backoff_seconds, s.max_backoff_seconds)
    return base // 2 + rng.randint(0, base - base // 2)


def _next_row(topic: Topic, o: PushOutcome, now: int, rng: random.Random) -> MessageState:
    row = o.row
    if o.error is None:
        # the lease it was delivered under stays, as a pull's ack keeps it: no tombstone
        return dataclasses.replace(row, state="delivered", version=row.version + 1,
                                   due_at_ms=now, updated_at_ms=now)
    error = o.error[:MAX_ERROR_CHARS]
    if leasing.attempts_used_up(topic, row):
        return leasing.dead(dataclasses.replace(row, last_error=error), now, error)
    return dataclasses.replace(
        row, state="scheduled", version=row.version + 1, lease_token=None,
        lease_expires_at_ms=None, last_error=error, updated_at_ms=now,
        due_at_ms=placement_ms(
            retry_due(topic, row, now + jittered_backoff_ms(row.attempts, topic, rng)), now))


def record_outcomes(services: Services, topic: Topic, outcomes: list[PushOutcome],
                    rng: random.Random) -> list[bool | Exception]:
    """Apply each outcome as an LWT over the leased version: delivered, due again after the
    backoff (its pointer written first; at its send window's next opening when the backoff
    ends outside it), or dead after max_attempts with the error kept.
    Per outcome: True applied, False the lease had moved on, or the exception."""
    now = services.clock()
    rows = [_next_row(topic, o, now, rng) for o in outcomes]
    retrying = [r for r in rows if r.state == "scheduled"]
    placed = {r.id for r in place_then(services, topic, retrying, now)} if retrying else set()
    results: list[bool | Exception] = [
        RuntimeError("could not place the retry pointer or record the dead message")
        for _ in rows]
    unrecorded = dead_letters.record(services, topic, rows)
    todo = [i for i, r in enumerate(rows)
            if (r.state != "scheduled" or r.id in placed) and r.id not in unrecorded]
    applied = services.messages.cas_many(
        [(rows[i], rows[i].version - 1,
          ttl_s(rows[i].due_at_ms, now, services.config.retention_days)) for i in todo],
        before={o.row.id: o.row for o in outcomes})
    for i, ok in zip(todo, applied, strict=True):
        results[i] = ok
    finished(services, topic, [rows[i] for i in todo if results[i] is True])
    count_moves(services, topic, [("leased", rows[i].state, rows[i].campaign) for i in todo
                                  if results[i] is True])
    # a failed POST notified nobody: its cap slot is free again
    frequency_caps.give_back(services, topic, [rows[i] for i in todo if results[i] is True
                                               and rows[i].state != "delivered"])
    return results
