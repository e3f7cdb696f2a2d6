"""Recurring schedules (schema/011_schedules.cql). Guarantees: a schedule row is changed only
by LWT, so a replace and a releaser advancing its cursor cannot interleave: create is
first-writer-wins, replace and delete apply over the version read, and the cursor moves only
from the value read (IF version = ? AND next_fire = ?): of two releasers producing the same
fires, one moves it and the other reads again."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from app.core.chunks import chunked
from app.core.timeparse import cql_ms
from app.store.session import CassandraSession

_COLUMNS = ("name", "cron", "timezone", "payload", "encoding", "priority", "campaign",
            "start_at", "end_at", "misfire", "version", "next_fire", "created_at", "updated_at")
_TIMES = {"start_at", "end_at", "next_fire", "created_at", "updated_at"}
_ADVANCE = ("UPDATE {ks}.schedules SET next_fire = ? WHERE topic_uid = ? AND name = ? "
            "IF version = ? AND next_fire = ?")
ADVANCE_BATCH = 100  # cursors moved by one conditional batch (one Paxos round)
NAMES_PER_READ = 100  # schedules read by one IN query


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One recurring schedule; times epoch ms. next_fire None: ended."""

    topic_uid: uuid.UUID
    name: str
    cron: str
    timezone: str
    payload: bytes
    encoding: str
    priority: int
    campaign: str | None
    start_at: int | None
    end_at: int | None
    misfire: str
    version: int
    next_fire: int | None
    created_at: int
    updated_at: int


def _schedule(topic_uid: uuid.UUID, row: dict[str, Any]) -> Schedule:
    values: dict[str, Any] = {
        c: (cql_ms(row[c]) if c in _TIMES and row[c] is not None else row[c]) for c in _COLUMNS}
    return Schedule(topic_uid=topic_uid, **values)


def _values(s: Schedule) -> list[Any]:
    return [getattr(s, c) for c in _COLUMNS]


class ScheduleStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def get(self, topic_uid: uuid.UUID, name: str) -> Schedule | None:
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM {{ks}}.schedules "
                               "WHERE topic_uid = ? AND name = ?", (topic_uid, name))
        return _schedule(topic_uid, rows[0]) if rows else None

    def get_many(self, topic_uid: uuid.UUID, names: list[str]) -> dict[str, Schedule]:
        """The schedules of these names that exist (IN reads of NAMES_PER_READ, in parallel)."""
        futures = [self.db.execute_async(
            f"SELECT {', '.join(_COLUMNS)} FROM {{ks}}.schedules "
            "WHERE topic_uid = ? AND name IN ?", (topic_uid, chunk))
            for chunk in chunked(names, NAMES_PER_READ)]
        return {r["name"]: _schedule(topic_uid, r) for rows in self.db.results(futures)
                for r in rows}

    def all(self, topic_uid: uuid.UUID) -> list[Schedule]:
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM {{ks}}.schedules "
                               "WHERE topic_uid = ?", (topic_uid,))
        return [_schedule(topic_uid, r) for r in rows]

    def create(self, s: Schedule) -> bool:
        rows = self.db.execute(
            f"INSERT INTO {{ks}}.schedules (topic_uid, {', '.join(_COLUMNS)}) "
            f"VALUES (?, {', '.join('?' for _ in _COLUMNS)}) IF NOT EXISTS",
            (s.topic_uid, *_values(s)))
        return bool(rows[0]["[applied]"])

    def replace(self, s: Schedule, expected_version: int) -> bool:
        """Rewrite the row (s.version is the new version) over expected_version."""
        columns = [c for c in _COLUMNS if c not in ("name", "created_at")]
        values = [v for c, v in zip(_COLUMNS, _values(s), strict=True) if c in columns]
        rows = self.db.execute(
            f"UPDATE {{ks}}.schedules SET {', '.join(f'{c} = ?' for c in columns)} "
            "WHERE topic_uid = ? AND name = ? IF version = ?",
            (*values, s.topic_uid, s.name, expected_version))
        return bool(rows[0]["[applied]"])

    def advance(self, s: Schedule, next_fire: int | None) -> bool:
        """Move the cursor from s.next_fire to next_fire, if nothing changed the row."""
        rows = self.db.execute(_ADVANCE, self._advance_params(s, next_fire))
        return bool(rows[0]["[applied]"])

    def advance_many(self, moves: list[tuple[Schedule, int | None]]) -> list[bool]:
        """advance() for schedules of one topic: one conditional batch (its partition) per
        ADVANCE_BATCH; a batch refused as a whole (one schedule changed meanwhile) is retried
        one schedule at a time, so each answer is that schedule's own."""
        chunks = chunked(moves, ADVANCE_BATCH)
        outcomes = self.db.run_batches([[(_ADVANCE, self._advance_params(s, nf))
                                          for s, nf in chunk] for chunk in chunks])
        answers: list[bool] = []
        for chunk, (ok, rows) in zip(chunks, outcomes, strict=True):
            if ok and rows[0]["[applied]"]:
                answers += [True] * len(chunk)
            else:
                answers += [self.advance(s, nf) for s, nf in chunk]
        return answers

    @staticmethod
    def _advance_params(s: Schedule, next_fire: int | None) -> tuple[Any, ...]:
        return (next_fire, s.topic_uid, s.name, s.version, s.next_fire)

    def delete(self, s: Schedule) -> bool:
        rows = self.db.execute("DELETE FROM {ks}.schedules WHERE topic_uid = ? AND name = ? "
                               "IF version = ?", (s.topic_uid, s.name, s.version))
        return bool(rows[0]["[applied]"])

    def list_in_slot(self, slot: int, s: Schedule) -> None:
        """List (or re-list with its new version) s in its slot, then move the slot's mark."""
        self.db.execute("INSERT INTO {ks}.schedule_slots (slot, topic_uid, name, version) "
                        "VALUES (?, ?, ?, ?)", (slot, s.topic_uid, s.name, s.version))
        self._mark(slot)

    def unlist(self, slot: int, topic_uid: uuid.UUID, name: str) -> None:
        self.db.execute("DELETE FROM {ks}.schedule_slots WHERE slot = ? AND topic_uid = ? "
                        "AND name = ?", (slot, topic_uid, name))
        self._mark(slot)

    def _mark(self, slot: int) -> None:
        # after the listing's write: a reader that sees the new mark then reads the new list
        self.db.execute("UPDATE {ks}.schedule_marks SET changed = now() WHERE part = 0 "
                        "AND slot = ?", (slot,))

    def marks(self) -> dict[int, uuid.UUID]:
        """Each slot's last listing change (slots never changed are absent): one read."""
        rows = self.db.execute("SELECT slot, changed FROM {ks}.schedule_marks WHERE part = 0")
        return {r["slot"]: r["changed"] for r in rows}

    def in_slots(self, slots: list[int]) -> list[tuple[int, uuid.UUID, str, int]]:
        """(slot, topic_uid, name, version) of the schedules of these slots (a read each)."""
        futures = [self.db.execute_async(
            "SELECT topic_uid, name, version FROM {ks}.schedule_slots WHERE slot = ?", (slot,))
            for slot in slots]
        return [(slot, r["topic_uid"], r["name"], r["version"])
                for slot, rows in zip(slots, self.db.results(futures), strict=True)
                for r in rows]
