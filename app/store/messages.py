"""Message state rows (LWT only) and immutable payloads (plain inserts, another table).

Guarantees:
- insert: first writer wins (IF NOT EXISTS); a loser gets the existing row back.
- cas: applies only if the row still has the version the caller read. Every transition bumps
  the version, so exactly one of any number of racing transitions from one version applies.
  A CAS that times out is resolved by a SERIAL read, never assumed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from cassandra import WriteTimeout
from cassandra.cluster import ResponseFuture
from cassandra.query import UNSET_VALUE

from app.errors import StoreUnavailable
from app.models import MessageState, Payload
from app.store.session import CassandraSession
from app.timeline import campaign_spread
from app.timeparse import cql_ms, from_ms

_COLUMNS = [
    "state", "version", "due_at", "deliver_at", "priority", "campaign", "shard", "attempts",
    "content_hash", "lease_token", "lease_expires_at", "consumer", "last_error", "created_at",
    "updated_at",
]
_TIMES = {"due_at", "deliver_at", "lease_expires_at", "created_at", "updated_at"}
_SELECT = f"SELECT topic_uid, id, {', '.join(_COLUMNS)} FROM {{ks}}.messages"
_INSERT = (
    f"INSERT INTO {{ks}}.messages (topic_uid, id, {', '.join(_COLUMNS)}) "
    f"VALUES (?, ?, {', '.join('?' for _ in _COLUMNS)}) IF NOT EXISTS USING TTL ?"
)
_CAS = (
    f"UPDATE {{ks}}.messages USING TTL ? SET {', '.join(f'{c} = ?' for c in _COLUMNS)} "
    "WHERE topic_uid = ? AND id = ? IF version = ?"
)
_INSERT_FRESH = (
    f"INSERT INTO {{ks}}.messages (topic_uid, id, {', '.join(_COLUMNS)}) "
    f"VALUES (?, ?, {', '.join('?' for _ in _COLUMNS)}) USING TTL ? AND TIMESTAMP {{wt}}"
)
FRESH_WRITETIME_US = 1
IN_CHUNK = 100


def _row_to_state(row: dict[str, Any]) -> MessageState:
    values: dict[str, Any] = {
        c: (cql_ms(row[c]) if c in _TIMES and row[c] is not None else row[c]) for c in _COLUMNS}
    return MessageState(
        topic_uid=row["topic_uid"], id=row["id"], state=values["state"],
        version=values["version"], due_at_ms=values["due_at"], deliver_at_ms=values["deliver_at"],
        priority=values["priority"], campaign=values["campaign"], shard=values["shard"],
        attempts=values["attempts"], content_hash=values["content_hash"],
        lease_token=values["lease_token"], lease_expires_at_ms=values["lease_expires_at"],
        consumer=values["consumer"], last_error=values["last_error"],
        created_at_ms=values["created_at"], updated_at_ms=values["updated_at"],
    )


def _column_values(m: MessageState) -> list[Any]:
    expires = None if m.lease_expires_at_ms is None else from_ms(m.lease_expires_at_ms)
    return [
        m.state, m.version, from_ms(m.due_at_ms), from_ms(m.deliver_at_ms), m.priority,
        m.campaign, m.shard, m.attempts, m.content_hash, m.lease_token, expires, m.consumer,
        m.last_error, from_ms(m.created_at_ms), from_ms(m.updated_at_ms),
    ]


def same_transition(found: MessageState, intended: MessageState) -> bool:
    """After an unknown CAS outcome: does the row show our write?"""
    return (found.version, found.state, found.lease_token, found.due_at_ms) == (
        intended.version, intended.state, intended.lease_token, intended.due_at_ms)


class MessageStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def insert_many(
        self, rows: Sequence[tuple[MessageState, int]],
    ) -> list[tuple[bool, MessageState | None] | Exception]:
        """Insert each (state, ttl_s) IF NOT EXISTS. Per row: (True, None) when inserted,
        (False, existing row) when the id was taken, or the exception that failed it."""
        # unset, not null: a null in an insert writes a tombstone cell for nothing
        params = [(m.topic_uid, m.id, *(UNSET_VALUE if v is None else v
                                        for v in _column_values(m)), ttl) for m, ttl in rows]
        answers: list[tuple[bool, MessageState | None] | Exception] = []
        for (ok, result), (m, _) in zip(self.db.execute_many(_INSERT, params), rows, strict=True):
            if not ok:
                answers.append(self._resolve_insert(m) if isinstance(result, WriteTimeout)
                               else result)
            elif result[0]["[applied]"]:
                answers.append((True, None))
            else:
                answers.append((False, _row_to_state(result[0])))
        return answers

    def insert_fresh_many(self, rows: Sequence[tuple[MessageState, int]]
                          ) -> list[tuple[bool, MessageState | None] | Exception]:
        """Insert (state, ttl_s) rows whose ids no one else can have (server-made ULIDs): a
        plain write, no LWT. Its write time, FRESH_WRITETIME_US, is below every LWT ballot, so
        the row's later transitions (all LWTs) always win over it; the one exception to "only
        LWTs write this table", and safe for that reason (docs/design.md, rule 7)."""
        params = [(m.topic_uid, m.id, *(UNSET_VALUE if v is None else v
                                        for v in _column_values(m)), ttl) for m, ttl in rows]
        cql = _INSERT_FRESH.replace("{wt}", str(FRESH_WRITETIME_US))
        return [(True, None) if ok else result
                for ok, result in self.db.execute_many(cql, params, concurrency=128)]

    def _resolve_insert(self, m: MessageState) -> tuple[bool, MessageState | None] | Exception:
        try:
            found = self.get(m.topic_uid, m.id, serial=True)
        except StoreUnavailable as exc:
            return exc
        if found is not None and found.content_hash == m.content_hash and found.version == 1:
            return (True, None)
        return (False, found) if found else StoreUnavailable("enqueue outcome unknown; retry")

    def get(self, topic_uid: uuid.UUID, message_id: str,
            serial: bool = False) -> MessageState | None:
        """The row, read at the configured consistency, or at SERIAL (sees in-flight LWTs)."""
        level = self.db.config.serial_consistency_level if serial else None
        rows = self.db.execute(_SELECT + " WHERE topic_uid = ? AND id = ?",
                               (topic_uid, message_id), consistency=level)
        return _row_to_state(rows[0]) if rows else None

    def get_many(self, topic_uid: uuid.UUID, ids: Sequence[str]) -> dict[str, MessageState]:
        """Rows of many ids of one topic (IN over the last partition-key column, chunked)."""
        unique = list(dict.fromkeys(ids))
        futures = [
            self.db.execute_async(_SELECT + " WHERE topic_uid = ? AND id IN ?",
                                  (topic_uid, unique[i:i + IN_CHUNK]))
            for i in range(0, len(unique), IN_CHUNK)
        ]
        return {r["id"]: _row_to_state(r) for rows in self.db.results(futures) for r in rows}

    def cas_many(
        self, changes: Sequence[tuple[MessageState, int, int]],
    ) -> list[bool | Exception]:
        """Apply each (new row, expected version, ttl_s) IF version = expected. Per change:
        True applied, False lost the race, or the exception (outcome resolved first)."""
        params = [(ttl, *_column_values(m), m.topic_uid, m.id, expected)
                  for m, expected, ttl in changes]
        outcomes: list[bool | Exception] = []
        for (ok, result), (m, _, _) in zip(self.db.execute_many(_CAS, params), changes,
                                           strict=True):
            if ok:
                outcomes.append(bool(result[0]["[applied]"]))
            elif isinstance(result, WriteTimeout):
                outcomes.append(self._resolve_cas(m))
            else:
                outcomes.append(result)
        return outcomes

    def cas(self, new: MessageState, expected_version: int, ttl_s: int) -> bool:
        """One conditional transition; raises StoreUnavailable when Cassandra cannot answer."""
        outcome = self.cas_many([(new, expected_version, ttl_s)])[0]
        if isinstance(outcome, Exception):
            raise StoreUnavailable(f"Cassandra unavailable: {type(outcome).__name__}")
        return outcome

    def _resolve_cas(self, intended: MessageState) -> bool | Exception:
        try:
            found = self.get(intended.topic_uid, intended.id, serial=True)
        except StoreUnavailable as exc:
            return exc
        return found is not None and same_transition(found, intended)

    def index_campaigns(self, topic_uid: uuid.UUID, members: Sequence[tuple[str, str]],
                        ttl: int) -> None:
        """Record (campaign, id) memberships (plain, idempotent inserts)."""
        outcomes = self.db.execute_many(
            "INSERT INTO {ks}.campaign_messages (topic_uid, campaign, spread, id) "
            "VALUES (?, ?, ?, ?) USING TTL ?",
            [(topic_uid, c, campaign_spread(i), i, ttl) for c, i in members])
        for ok, result in outcomes:
            if not ok:
                raise StoreUnavailable(f"Cassandra unavailable: {type(result).__name__}")

    def put_payloads(self, rows: Sequence[tuple[uuid.UUID, str, str, Payload, int]]
                     ) -> list[Exception | None]:
        """Plain inserts of (topic_uid, id, content_hash, payload, ttl_s); None where written."""
        params = [(t, i, h, p.data, p.encoding, p.headers or None, ttl) for t, i, h, p, ttl in rows]
        outcomes = self.db.execute_many(
            "INSERT INTO {ks}.message_payloads (topic_uid, id, content_hash, payload, encoding, "
            "headers) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?", params)
        return [None if ok else result for ok, result in outcomes]

    def get_payloads(self, topic_uid: uuid.UUID, keys: Sequence[tuple[str, str]]
                     ) -> dict[str, Payload]:
        """Payloads of (id, content_hash) pairs of one topic, by id."""
        return self.collect_payloads(self.start_payloads(topic_uid, keys))

    def start_payloads(self, topic_uid: uuid.UUID, keys: Sequence[tuple[str, str]]
                       ) -> tuple[dict[str, str], list[ResponseFuture]]:
        """Start reading payloads (to overlap with other round trips); see collect_payloads."""
        wanted = dict(keys)
        futures = [
            self.db.execute_async(
                "SELECT id, content_hash, payload, encoding, headers FROM {ks}.message_payloads "
                "WHERE topic_uid = ? AND id IN ?", (topic_uid, list(wanted)[i:i + IN_CHUNK]))
            for i in range(0, len(wanted), IN_CHUNK)
        ]
        return wanted, futures

    def collect_payloads(self, started: tuple[dict[str, str], list[ResponseFuture]]
                         ) -> dict[str, Payload]:
        wanted, futures = started
        found = {}
        for rows in self.db.results(futures):
            for r in rows:
                if wanted.get(r["id"]) == r["content_hash"]:
                    found[r["id"]] = Payload(r["payload"], r["encoding"], dict(r["headers"] or {}))
        return found
