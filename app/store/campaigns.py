"""Campaign rows, bounds and counters (schema/008_campaigns.cql).

Guarantees:
- a campaign row is changed only by LWT: create is first-writer-wins, a control change
  applies only over the values the caller read, and at most one operation runs on a
  campaign at a time (begin_op IF op_id = null, end_op IF op_id = the operation's);
- bounds need no read and no LWT: each cell is written with a write time derived from its
  value, so the earliest first_deliver_at and the latest last_deliver_at of a generation win
  whatever the order of the writes;
- counters move once per applied transition and are never retried (as app.store.counts).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from app.core.timeline import CAMPAIGN_SPREAD
from app.core.timeparse import cql_ms
from app.errors import StoreUnavailable
from app.store.counts import flush_counters
from app.store.session import CassandraSession

# Bounds cells are written USING TIMESTAMP = ms (latest wins) or BOUNDS_BASE - ms (earliest
# wins); past the year 2248 (2^43 ms) the latter goes negative, which Cassandra orders alike.
BOUNDS_BASE = 1 << 43
_COLUMNS = ("campaign", "created_at", "bounds_gen", "paused", "max_per_second", "cancelled",
            "controls_version", "op_id", "op_kind", "updated_at")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM {{ks}}.campaigns WHERE topic_uid = ?"
_COUNT = ("UPDATE {ks}.campaign_counts SET n = n + ? "
          "WHERE topic_uid = ? AND campaign = ? AND state = ?")
_FIRST = ("UPDATE {ks}.campaign_bounds USING TIMESTAMP ? SET first_deliver_at = ? "
          "WHERE topic_uid = ? AND campaign = ? AND gen = ?")
_LAST = ("UPDATE {ks}.campaign_bounds USING TIMESTAMP ? SET last_deliver_at = ? "
         "WHERE topic_uid = ? AND campaign = ? AND gen = ?")

RESERVE_TRIES = 20  # LWT rounds a slot reservation may lose to other processes
Span = tuple[int, int]  # (earliest, latest) deliver_at, epoch ms


@dataclasses.dataclass(frozen=True)
class Campaign:
    """A campaign's row: its controls and the operation running on it, if any."""

    name: str
    created_at_ms: int
    bounds_gen: int = 0
    paused: bool = False
    max_per_second: float | None = None
    cancelled: bool = False
    controls_version: int = 0
    op_id: uuid.UUID | None = None
    op_kind: str | None = None
    updated_at_ms: int = 0


def _campaign(row: dict[str, Any]) -> Campaign:
    return Campaign(
        name=row["campaign"], created_at_ms=cql_ms(row["created_at"]),
        bounds_gen=row["bounds_gen"] or 0, paused=bool(row["paused"]),
        max_per_second=row["max_per_second"], cancelled=bool(row["cancelled"]),
        controls_version=row["controls_version"] or 0,
        op_id=row["op_id"], op_kind=row["op_kind"],
        updated_at_ms=cql_ms(row["updated_at"]) if row["updated_at"] else 0)


class CampaignStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def get(self, topic_uid: uuid.UUID, name: str) -> Campaign | None:
        rows = self.db.execute(_SELECT + " AND campaign = ?", (topic_uid, name))
        return _campaign(rows[0]) if rows else None

    def all(self, topic_uid: uuid.UUID) -> list[Campaign]:
        """Every campaign of a topic (one partition), by name."""
        return [_campaign(r) for r in self.db.execute(_SELECT, (topic_uid,))]

    def create(self, topic_uid: uuid.UUID, name: str, now_ms: int) -> Campaign:
        """The campaign's row, made now if no writer made it first."""
        rows = self.db.execute(
            "INSERT INTO {ks}.campaigns (topic_uid, campaign, created_at, bounds_gen, "
            "controls_version, updated_at) VALUES (?, ?, ?, 0, 0, ?) IF NOT EXISTS",
            (topic_uid, name, now_ms, now_ms))
        if rows[0]["[applied]"]:
            return Campaign(name, now_ms, updated_at_ms=now_ms)
        return _campaign({c: rows[0].get(c) for c in _COLUMNS})

    def set_controls(self, topic_uid: uuid.UUID, seen: Campaign, paused: bool,
                     max_per_second: float | None, now_ms: int) -> bool:
        """Set paused and max_per_second over the controls `seen` holds; False if another
        change of them came first."""
        rows = self.db.execute(
            "UPDATE {ks}.campaigns SET paused = ?, max_per_second = ?, controls_version = ?, "
            "updated_at = ? WHERE topic_uid = ? AND campaign = ? IF controls_version = ?",
            (paused, max_per_second, seen.controls_version + 1, now_ms, topic_uid,
             seen.name, seen.controls_version))
        return bool(rows[0]["[applied]"])

    def begin_op(self, topic_uid: uuid.UUID, name: str, op_id: uuid.UUID, kind: str,
                 now_ms: int) -> Campaign | None:
        """Make op_id the campaign's running operation (a cancel also marks the campaign
        cancelled, for good). None if it applied; else the row as it is (another operation
        runs, or the campaign is gone)."""
        cancelled = ", cancelled = true" if kind == "cancel" else ""
        rows = self.db.execute(
            f"UPDATE {{ks}}.campaigns SET op_id = ?, op_kind = ?, updated_at = ?{cancelled} "
            "WHERE topic_uid = ? AND campaign = ? IF op_id = null",
            (op_id, kind, now_ms, topic_uid, name))
        if rows[0]["[applied]"]:
            return None
        return self.get(topic_uid, name)

    def end_op(self, topic_uid: uuid.UUID, name: str, op_id: uuid.UUID,
               bounds_gen: int | None, now_ms: int) -> bool:
        """Clear the running operation op_id (making bounds_gen current, given one)."""
        gen = "" if bounds_gen is None else ", bounds_gen = ?"
        params: tuple[Any, ...] = (now_ms,) + (() if bounds_gen is None else (bounds_gen,))
        rows = self.db.execute(
            f"UPDATE {{ks}}.campaigns SET op_id = null, op_kind = null, updated_at = ?{gen} "
            "WHERE topic_uid = ? AND campaign = ? IF op_id = ?",
            (*params, topic_uid, name, op_id))
        return bool(rows[0]["[applied]"])

    def widen(self, topic_uid: uuid.UUID, spans: Mapping[tuple[str, int], Span]) -> None:
        """Widen the bounds of (campaign, generation)s to cover these spans."""
        batches = [[(_FIRST, (BOUNDS_BASE - first, first, topic_uid, name, gen)),
                    (_LAST, (last, last, topic_uid, name, gen))]
                   for (name, gen), (first, last) in spans.items()]
        for ok, result in self.db.run_batches(batches):
            if not ok:
                raise StoreUnavailable(f"Cassandra unavailable: {type(result).__name__}")

    def bounds(self, topic_uid: uuid.UUID, name: str, gen: int) -> tuple[int | None, int | None]:
        """(first, last) deliver_at of a generation, epoch ms (None before any message)."""
        rows = self.db.execute(
            "SELECT first_deliver_at, last_deliver_at FROM {ks}.campaign_bounds "
            "WHERE topic_uid = ? AND campaign = ? AND gen = ?", (topic_uid, name, gen))
        if not rows:
            return None, None
        first, last = rows[0]["first_deliver_at"], rows[0]["last_deliver_at"]
        return (cql_ms(first) if first else None, cql_ms(last) if last else None)

    def members_after(self, topic_uid: uuid.UUID, name: str, after_id: str,
                      per_spread: int) -> tuple[list[str], bool]:
        """The campaign's next ids after after_id, in id order, read from every index
        partition at once (up to per_spread each), with no gap: an id is returned only if
        every partition has been read past it. Returns (ids, finished): finished when no
        partition had more. A home's messages have adjacent ids (one request made them), so
        a page holds them together whatever partitions the index spread them over."""
        futures = [self.db.execute_async(
            "SELECT id FROM {ks}.campaign_messages WHERE topic_uid = ? AND campaign = ? "
            "AND spread = ? AND id > ? LIMIT ?", (topic_uid, name, spread, after_id,
                                                  per_spread))
            for spread in range(CAMPAIGN_SPREAD)]
        pages = [[r["id"] for r in rows] for rows in self.db.results(futures)]
        full = [page[-1] for page in pages if len(page) == per_spread]
        bound = min(full) if full else None
        ids = sorted(i for page in pages for i in page if bound is None or i <= bound)
        return ids, not full

    def reserve_slots(self, topic_uid: uuid.UUID, name: str, count: int, rate: float,
                      now_ms: int) -> int:
        """Reserve `count` consecutive delivery slots of a campaign paced at `rate` messages
        per second, the first at the later of now and its next free slot; returns the first
        slot's time in epoch microseconds (slot i is at first + i * 1e6 / rate). Slots are
        never handed out twice: each reservation is an LWT over the value read."""
        known: int | None = None
        for _ in range(RESERVE_TRIES):
            start = max(known or 0, now_ms * 1000)
            end = start + round(count * 1_000_000 / rate)
            if known is None:
                rows = self.db.execute(
                    "INSERT INTO {ks}.campaign_pace (topic_uid, campaign, next_us) "
                    "VALUES (?, ?, ?) IF NOT EXISTS", (topic_uid, name, end))
            else:
                rows = self.db.execute(
                    "UPDATE {ks}.campaign_pace SET next_us = ? WHERE topic_uid = ? AND "
                    "campaign = ? IF next_us = ?", (end, topic_uid, name, known))
            if rows[0]["[applied]"]:
                return start
            known = rows[0]["next_us"]
        raise StoreUnavailable(f"Pacing slots of campaign {name!r} are contended; retry.")

    def add_counts(self, topic_uid: uuid.UUID, deltas: Mapping[str, Mapping[str, int]]) -> None:
        """Apply {campaign: {state: delta}}."""
        self.db.results(self.db.counter_batches(self.count_updates(topic_uid, deltas)))

    @staticmethod
    def count_updates(topic_uid: uuid.UUID, deltas: Mapping[str, Mapping[str, int]]
                      ) -> list[tuple[str, tuple[Any, ...]]]:
        """The counter updates of add_counts, to send with others."""
        return [(_COUNT, (d, topic_uid, name, state))
                for name, per_state in deltas.items() for state, d in per_state.items() if d]

    def counts(self, topic_uid: uuid.UUID, names: list[str]) -> dict[str, dict[str, int]]:
        """{campaign: {state: n}} for these campaigns (one read each, concurrently), read
        after this process's counter moves are written (app.store.counts.flush_counters)."""
        flush_counters()
        futures = [self.db.execute_async(
            "SELECT state, n FROM {ks}.campaign_counts WHERE topic_uid = ? AND campaign = ?",
            (topic_uid, name)) for name in names]
        return {name: {r["state"]: r["n"] for r in rows}
                for name, rows in zip(names, self.db.results(futures), strict=True)}
