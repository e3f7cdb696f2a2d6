"""Message state rows (LWT only) and immutable payloads (plain inserts, another table).

Rows live in their message's home partition ((topic_uid, home), id) (app.core.ids.home_of), so the
transitions of many messages of one home go in one conditional batch: one Paxos round, each
row with its own condition. Per row the guarantees are those of a single-row LWT:
- insert: first writer wins (IF NOT EXISTS); a loser gets the existing row back.
- cas: applies only if the row still has the version the caller read. Every transition bumps
  the version, so exactly one of any number of racing transitions from one version applies.
  A conditional batch applies all its rows or none: when one row's condition fails, the rows
  whose conditions still hold are sent again without it.
- An LWT or batch that times out is resolved by SERIAL reads, never assumed.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cassandra import OperationTimedOut, WriteTimeout
from cassandra.cluster import ResponseFuture
from cassandra.query import UNSET_VALUE

from app.core.chunks import chunked
from app.core.ids import home_of
from app.core.timeline import campaign_spread, ttl_s
from app.core.timeparse import cql_ms
from app.errors import StoreUnavailable
from app.models import MessageState, Payload
from app.ops import metrics
from app.store.session import BatchRun, CassandraSession, item_errors

_COLUMNS = [
    "state", "version", "due_at", "deliver_at", "priority", "campaign", "shard", "attempts",
    "content_hash", "lease_token", "lease_expires_at", "consumer", "last_error", "created_at",
    "updated_at", "last_op", "paced", "delivery_group", "send_window", "requested_at",
    "recipient", "timezone", "cap_exempt", "cancel_reason",
]
_TIMES = {"due_at", "deliver_at", "lease_expires_at", "created_at", "updated_at",
          "requested_at"}
# labels, a map, apart from _COLUMNS: a transition adds its entries (labels + ?), which
# writes no deletion marker, where setting the whole map would (_label_params)
_SELECT = f"SELECT topic_uid, id, {', '.join(_COLUMNS)}, labels FROM {{ks}}.message_states"
_VALUES = (f"(topic_uid, home, id, {', '.join(_COLUMNS)}, labels) "
           f"VALUES (?, ?, ?, {', '.join('?' for _ in _COLUMNS)}, ?)")
_INSERT = f"INSERT INTO {{ks}}.message_states {_VALUES} IF NOT EXISTS USING TTL ?"
_CAS = (
    f"UPDATE {{ks}}.message_states USING TTL ? SET {', '.join(f'{c} = ?' for c in _COLUMNS)}, "
    "labels = labels + ?, labels = labels - ? "
    "WHERE topic_uid = ? AND home = ? AND id = ? IF version = ?"
)
# An ack needs no read first: the lease token carries the version it was leased at (and the
# lease's expiry), and version, token and expiry are the whole condition. Only the columns an
# ack changes are set; the others keep their values and TTLs, so the TTL of these ends a
# moment before theirs (deliver_many) and readers take a row without a state as gone.
_DELIVER = (
    "UPDATE {ks}.message_states USING TTL ? SET state = 'delivered', version = ?, due_at = ?, "
    "updated_at = ? WHERE topic_uid = ? AND home = ? AND id = ? "
    "IF version = ? AND lease_token = ? AND lease_expires_at = ? AND campaign = ?"
)
FRESH_WRITETIME_US = 1
_INSERT_FRESH = (f"INSERT INTO {{ks}}.message_states {_VALUES} "
                 f"USING TTL ? AND TIMESTAMP {FRESH_WRITETIME_US}")
_PUT_PAYLOAD = (
    "INSERT INTO {ks}.message_bodies (topic_uid, home, id, content_hash, payload, encoding, "
    "headers) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?"
)
_GET_PAYLOADS = (
    "SELECT id, content_hash, payload, encoding, headers FROM {ks}.message_bodies "
    "WHERE topic_uid = ? AND home = ? AND id IN ?"
)
_INDEX = ("INSERT INTO {ks}.campaign_messages (topic_uid, campaign, spread, id) "
          "VALUES (?, ?, ?, ?) USING TTL ?")
IN_CHUNK = 100
CONDITIONAL_BATCH = 100  # rows per Paxos round: bounds the round's read and mutation
PLAIN_BATCH = 100
PAYLOAD_BATCH_BYTES = 1 << 20  # well under a commit-log segment's mutation limit
# a conditional write that timed out, on the node or in the driver waiting for its answer,
# may have applied
UNKNOWN_OUTCOME = (WriteTimeout, OperationTimedOut)
# changes left undecided, kept for their taker's next try of the same row (earlier_changes)
UNDECIDED_KEPT = 4096

Home = tuple[uuid.UUID, int]
Ack = tuple[str, uuid.UUID, int, int, str | None]  # id, token, version, expiry ms, campaign


def _home(topic_uid: uuid.UUID, message_id: str) -> Home:
    return topic_uid, home_of(message_id)


def _by_home(keys: Iterable[tuple[Home, int]], size: int,
             weight: Callable[[int], int] | None = None, cap: int = 0) -> list[list[int]]:
    """Indexes grouped by home into chunks of at most `size` (and, given weight, at most `cap`
    total weight); order inside a home is kept."""
    homes: dict[Home, list[int]] = defaultdict(list)
    for home, index in keys:
        homes[home].append(index)
    chunks: list[list[int]] = []
    for members in homes.values():
        chunk: list[int] = []
        load = 0
        for index in members:
            extra = weight(index) if weight else 0
            if chunk and (len(chunk) >= size or (weight and load + extra > cap)):
                chunks.append(chunk)
                chunk, load = [], 0
            chunk.append(index)
            load += extra
        chunks.append(chunk)
    return chunks


PayloadRow = tuple[uuid.UUID, str, str, Payload, int]  # topic_uid, id, content hash, body, ttl_s
Batch = list[tuple[str, Sequence[Any]]]


def _payload_batches(rows: Sequence[PayloadRow], size: int = PLAIN_BATCH
                     ) -> tuple[list[list[int]], list[Batch]]:
    chunks = _by_home(((_home(t, i), n) for n, (t, i, _, _, _) in enumerate(rows)),
                      size, weight=lambda n: len(rows[n][3].data), cap=PAYLOAD_BATCH_BYTES)
    return chunks, [[
        (_PUT_PAYLOAD, (t, home_of(i), i, h, p.data, p.encoding, p.headers or None, ttl))
        for t, i, h, p, ttl in (rows[n] for n in chunk)] for chunk in chunks]


def _member_batches(topic_uid: uuid.UUID, members: Sequence[tuple[str, str, int]]
                    ) -> tuple[list[list[int]], list[Batch]]:
    partitions: dict[tuple[str, int], list[int]] = defaultdict(list)
    for n, (campaign, message_id, _) in enumerate(members):
        partitions[(campaign, campaign_spread(message_id))].append(n)
    chunks = [chunk for indexes in partitions.values()
              for chunk in chunked(indexes, PLAIN_BATCH)]
    return chunks, [[(_INDEX, (topic_uid, members[n][0], campaign_spread(members[n][1]),
                               members[n][1], members[n][2])) for n in chunk]
                    for chunk in chunks]


def _row_to_state(row: dict[str, Any], topic_uid: uuid.UUID | None = None) -> MessageState:
    """The row as read; its topic_uid the one given, if any (the caller's object, shared by
    all rows of the topic: a releaser holds tens of thousands of rows, and each UUID of
    their own is one more object Python's collector tracks)."""
    values: dict[str, Any] = {
        c: (cql_ms(row[c]) if c in _TIMES and row[c] is not None else row[c]) for c in _COLUMNS}
    return MessageState(
        topic_uid=topic_uid or row["topic_uid"], id=row["id"], state=values["state"],
        version=values["version"], due_at_ms=values["due_at"], deliver_at_ms=values["deliver_at"],
        priority=values["priority"], campaign=values["campaign"], shard=values["shard"],
        attempts=values["attempts"], content_hash=values["content_hash"],
        lease_token=values["lease_token"], lease_expires_at_ms=values["lease_expires_at"],
        consumer=values["consumer"], last_error=values["last_error"],
        created_at_ms=values["created_at"], updated_at_ms=values["updated_at"],
        last_op=values["last_op"], paced=bool(values["paced"]), group=values["delivery_group"],
        send_window=values["send_window"], requested_at_ms=values["requested_at"],
        recipient=values["recipient"], timezone=values["timezone"],
        cap_exempt=values["cap_exempt"], cancel_reason=values["cancel_reason"],
        labels=dict(row["labels"]) if row["labels"] else None,
    )


def _whole(row: dict[str, Any]) -> bool:
    """False for what is left of a row whose state columns have expired a moment before its
    other columns (an ack without a read sets only the columns it changes, with a TTL that
    ends no later than theirs): such a row is gone."""
    return row["state"] is not None and row["version"] is not None


def _column_values(m: MessageState, before: MessageState | None = None) -> list[Any]:
    """The row's column values in _COLUMNS' order. Given the row as stored before the change
    (at the version the change expects), a column null in both is left unset: a null
    written is a cell tombstone."""
    values = _values(m)
    if before is None:
        return values
    return [UNSET_VALUE if v is None and w is None else v
            for v, w in zip(values, _values(before), strict=True)]


def _values(m: MessageState) -> list[Any]:
    return [
        m.state, m.version, m.due_at_ms, m.deliver_at_ms, m.priority, m.campaign, m.shard,
        m.attempts, m.content_hash, m.lease_token, m.lease_expires_at_ms, m.consumer,
        m.last_error, m.created_at_ms, m.updated_at_ms,
        # a transition carries last_op forward; unset, not null, keeps it without a tombstone
        UNSET_VALUE if m.last_op is None else m.last_op, m.paced,
        UNSET_VALUE if m.group is None else m.group,
        # written again by every change, so their TTL follows the row's as due_at's does; a
        # null in both before and after is left unset (_column_values)
        m.send_window, m.requested_at_ms, m.recipient, m.timezone, m.cap_exempt,
        m.cancel_reason,
    ]


def _label_params(m: MessageState, before: MessageState | None) -> tuple[Any, Any]:
    """(entries to add, keys to remove) of a transition's labels. Every transition adds the
    row's entries again, so their TTL follows the row's; only a replace that drops a key
    removes it (a cell tombstone each). Unset where there is nothing to add or remove."""
    gone = set(before.labels or {}) - set(m.labels or {}) if before is not None else set()
    return m.labels or UNSET_VALUE, gone or UNSET_VALUE


def _at(row: MessageState | None, version: int) -> MessageState | None:
    """row, when it is at that version (the one a change expects), else None."""
    return row if row is not None and row.version == version else None


def same_transition(found: MessageState, intended: MessageState) -> bool:
    """After an unknown CAS outcome: does the row show our write?"""
    return (found.version, found.state, found.lease_token, found.due_at_ms) == (
        intended.version, intended.state, intended.lease_token, intended.due_at_ms)


class Staging:
    """An enqueue's stage being written (MessageStore.start_stage)."""

    def __init__(self, run: BatchRun, chunks: tuple[list[list[int]], list[list[int]],
                                                     list[list[int]]],
                 counts: tuple[int, int, int]) -> None:
        self._run = run
        self._chunks = chunks
        self._counts = counts
        self._errors: tuple[list[Exception | None], ...] | None = None

    def errors(self) -> tuple[list[Exception | None], list[Exception | None],
                              list[Exception | None]]:
        """Wait (once) for the stage: per payload, member and fresh entry, None where
        written, else the error."""
        if self._errors is None:
            outcomes = self._run.outcomes()
            found = []
            at = 0
            for chunks, count in zip(self._chunks, self._counts, strict=True):
                found.append(item_errors(chunks, outcomes[at:at + len(chunks)], count))
                at += len(chunks)
            self._errors = tuple(found)
        payload_errors, member_errors, fresh_errors = self._errors
        return payload_errors, member_errors, fresh_errors


class MessageStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db
        # (topic_uid, id, expected version) -> the change this process left undecided
        self._undecided: OrderedDict[tuple[uuid.UUID, str, int], MessageState] = OrderedDict()
        self._undecided_lock = threading.Lock()

    def _params(self, m: MessageState, ttl: int) -> tuple[Any, ...]:
        # unset, not null: a null in an insert writes a tombstone cell for nothing
        return (m.topic_uid, home_of(m.id), m.id,
                *(UNSET_VALUE if v is None else v for v in _column_values(m)),
                m.labels or UNSET_VALUE, ttl)

    def _conditional(self, cql: str, entries: Sequence[tuple[Home, str, Sequence[Any]]],
                     holds: Callable[[int, dict[str, Any] | None], bool]) -> list[Any]:
        """Run conditional statements (home, id, params) in one batch per home chunk. Per
        entry: True applied; the current row (or None when absent) when its own condition
        failed; or the exception that failed its batch. holds(index, current row) says whether
        an entry's condition still holds after its batch was refused for another row."""
        results: list[Any] = [None] * len(entries)
        pending = list(range(len(entries)))
        while pending:
            chunks, deferred = self._distinct_chunks(entries, pending)
            outcomes = self.db.run_batches(
                [[(cql, entries[i][2]) for i in chunk] for chunk in chunks])
            pending = deferred
            for chunk, (ok, rows) in zip(chunks, outcomes, strict=True):
                pending.extend(self._settle_chunk(entries, chunk, ok, rows, holds, results))
        return results

    @staticmethod
    def _distinct_chunks(entries: Sequence[tuple[Home, str, Sequence[Any]]],
                         pending: list[int]) -> tuple[list[list[int]], list[int]]:
        """Chunks for one round, each id once per round (two changes of one row in a batch
        would share one condition read); later repeats wait for the next round."""
        seen: set[tuple[Home, str]] = set()
        now: list[int] = []
        later: list[int] = []
        for i in pending:
            key = (entries[i][0], entries[i][1])
            (later if key in seen else now).append(i)
            seen.add(key)
        return _by_home(((entries[i][0], i) for i in now), CONDITIONAL_BATCH), later

    @staticmethod
    def _settle_chunk(entries: Sequence[tuple[Home, str, Sequence[Any]]], chunk: list[int],
                      ok: bool, rows: Any, holds: Callable[[int, dict[str, Any] | None], bool],
                      results: list[Any]) -> list[int]:
        """Record one batch's outcome; returns the entries to send again."""
        if not ok:
            for i in chunk:
                results[i] = rows
            return []
        if rows[0]["[applied]"]:
            for i in chunk:
                results[i] = True
            return []
        # a refused update of a row that does not exist comes back without columns
        current = {r["id"]: r for r in rows if r.get("id") is not None}
        again = [i for i in chunk if holds(i, current.get(entries[i][1]))]
        if len(again) == len(chunk):  # cannot happen if Cassandra reports as documented
            again = []
        for i in chunk:
            if i not in again:
                results[i] = current.get(entries[i][1])
        return again

    def insert_many(
        self, rows: Sequence[tuple[MessageState, int]],
    ) -> list[tuple[bool, MessageState | None] | Exception]:
        """Insert each (state, ttl_s) IF NOT EXISTS. Per row: (True, None) when inserted,
        (False, existing row) when the id was taken, or the exception that failed it."""
        entries = [(_home(m.topic_uid, m.id), m.id, self._params(m, ttl)) for m, ttl in rows]
        outcomes = self._conditional(_INSERT, entries, lambda _i, found: found is None)
        answers: list[tuple[bool, MessageState | None] | Exception] = []
        for (m, _), outcome in zip(rows, outcomes, strict=True):
            if outcome is True:
                answers.append((True, None))
            elif isinstance(outcome, dict):
                answers.append((False, _row_to_state(outcome)))
            elif isinstance(outcome, UNKNOWN_OUTCOME) or outcome is None:
                answers.append(self._resolve_insert(m))
            else:
                answers.append(outcome)
        return answers

    def insert_fresh_many(self, rows: Sequence[tuple[MessageState, int]]
                          ) -> list[tuple[bool, MessageState | None] | Exception]:
        """Insert (state, ttl_s) rows whose ids no one else can have (server-made ULIDs): plain
        writes, one unlogged batch per home. Their write time, FRESH_WRITETIME_US, is below
        every LWT ballot, so the rows' later transitions (all LWTs) always win over them; the
        one exception to "only LWTs write this table", and safe for that reason
        (docs/design.md, rule 7)."""
        chunks = _by_home(((_home(m.topic_uid, m.id), i) for i, (m, _) in enumerate(rows)),
                          PLAIN_BATCH)
        outcomes = self.db.run_batches(
            [[(_INSERT_FRESH, self._params(*rows[i])) for i in chunk] for chunk in chunks])
        return [(True, None) if err is None else err
                for err in item_errors(chunks, outcomes, len(rows))]

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
        level = self.db.serial_level if serial else None
        rows = self.db.execute(_SELECT + " WHERE topic_uid = ? AND home = ? AND id = ?",
                               (topic_uid, home_of(message_id), message_id), consistency=level)
        return _row_to_state(rows[0]) if rows and _whole(rows[0]) else None

    def get_many(self, topic_uid: uuid.UUID, ids: Sequence[str]) -> dict[str, MessageState]:
        """Rows of many ids of one topic: one read per home (IN over its ids, chunked)."""
        unique = list(dict.fromkeys(ids))
        chunks = _by_home(((_home(topic_uid, i), n) for n, i in enumerate(unique)), IN_CHUNK)
        futures = [
            self.db.execute_async(_SELECT + " WHERE topic_uid = ? AND home = ? AND id IN ?",
                                  (topic_uid, home_of(unique[c[0]]), [unique[n] for n in c]))
            for c in chunks
        ]
        return {r["id"]: _row_to_state(r, topic_uid) for rows in self.db.results(futures)
                for r in rows if _whole(r)}

    def cas_many(
        self, changes: Sequence[tuple[MessageState, int, int]],
        before: Mapping[str, MessageState] | None = None,
    ) -> list[bool | Exception]:
        """Apply each (new row, expected version, ttl_s) IF version = expected, one conditional
        batch per home. `before`, by id, the rows read at the expected versions: a column
        null in both is not written (no tombstone). Per change: True applied, False lost
        the race, or the exception (outcome resolved first)."""
        known = before or {}
        entries = [(_home(m.topic_uid, m.id), m.id,
                    (ttl, *_column_values(m, _at(known.get(m.id), expected)),
                     *_label_params(m, _at(known.get(m.id), expected)),
                     m.topic_uid, home_of(m.id), m.id, expected))
                   for m, expected, ttl in changes]

        def holds(index: int, found: dict[str, Any] | None) -> bool:
            return found is not None and found["version"] == changes[index][1]

        outcomes: list[bool | Exception] = []
        for (m, expected, _), outcome in zip(changes, self._conditional(_CAS, entries, holds),
                                             strict=True):
            if outcome is True:
                outcomes.append(True)
            elif isinstance(outcome, UNKNOWN_OUTCOME):
                outcomes.append(self._resolve_cas(m, expected, outcome))
            elif isinstance(outcome, Exception):
                outcomes.append(outcome)
            else:
                outcomes.append(False)
            if isinstance(outcomes[-1], Exception):
                self._remember_undecided(m, expected)
        lost = outcomes.count(False)
        if lost:
            metrics.CONDITIONAL_NOT_APPLIED.labels("message_states").inc(lost)
        return outcomes

    def deliver_many(self, topic_uid: uuid.UUID,
                     acks: Sequence[Ack], now_ms: int, retention_days: int) -> list[bool]:
        """Mark delivered each (id, lease token, leased version, lease expiry ms, campaign)
        whose row is still at that version, with that token, expiry and campaign, when the
        expiry is after now_ms: one conditional batch per home, no read first. True where it
        applied; False where it did not or the outcome could not be known (the caller decides
        those on a fresh read)."""
        live = [n for n, a in enumerate(acks) if a[3] > now_ms]
        answers = [False] * len(acks)
        for n, ok in zip(live, self._deliver(topic_uid, [acks[n] for n in live], now_ms,
                                             retention_days), strict=True):
            answers[n] = ok
        return answers

    def _deliver(self, topic_uid: uuid.UUID, acks: Sequence[Ack], now_ms: int,
                 retention_days: int) -> list[bool]:
        entries = []
        for i, token, v, expires_ms, campaign in acks:
            # the lease wrote the row's other columns to live until its expiry plus the
            # retention window; these end up to 2 s sooner, never later (second rounding)
            ttl = max(1, ttl_s(expires_ms, now_ms, retention_days) - 2)
            entries.append((_home(topic_uid, i), i, (
                ttl, v + 1, now_ms, now_ms, topic_uid, home_of(i), i, v, token, expires_ms,
                campaign)))

        def holds(index: int, found: dict[str, Any] | None) -> bool:
            _, token, v, expires_ms, campaign = acks[index]
            return (found is not None and found["version"] == v
                    and found["lease_token"] == token and found["lease_expires_at"] is not None
                    and cql_ms(found["lease_expires_at"]) == expires_ms
                    and found["campaign"] == campaign)

        answers = []
        for (i, token, v, _, _), outcome in zip(acks, self._conditional(_DELIVER, entries, holds),
                                             strict=True):
            if isinstance(outcome, UNKNOWN_OUTCOME):
                try:
                    found = self.get(topic_uid, i, serial=True)
                except StoreUnavailable:
                    found = None
                outcome = (found is not None and found.state == "delivered"
                           and found.version == v + 1 and found.lease_token == token)
            answers.append(outcome is True)
        return answers

    def cas(self, new: MessageState, expected_version: int, ttl_s: int,
            before: MessageState | None = None) -> bool:
        """One conditional transition; raises StoreUnavailable when Cassandra cannot answer.
        `before`: the row as read (cas_many)."""
        outcome = self.cas_many([(new, expected_version, ttl_s)],
                                None if before is None else {new.id: before})[0]
        if isinstance(outcome, Exception):
            raise StoreUnavailable(f"Cassandra unavailable: {type(outcome).__name__}")
        return outcome

    def _remember_undecided(self, intended: MessageState, expected: int) -> None:
        with self._undecided_lock:
            self._undecided[(intended.topic_uid, intended.id, expected)] = intended
            while len(self._undecided) > UNDECIDED_KEPT:
                self._undecided.popitem(last=False)

    def earlier_changes(self, changes: Sequence[tuple[MessageState, int, int]],
                        outcomes: Sequence[bool | Exception]) -> dict[int, MessageState]:
        """Of the changes cas_many answered False whose row, at the same expected version,
        this process changed before with an undecided outcome: those where a SERIAL read
        shows that earlier change applied after all (the node finished its Paxos round after
        the timeout, or the read that would have told failed). Index -> the row as stored,
        which the caller hands out instead of leaving it leased to nobody until its lease
        runs out."""
        found: dict[int, MessageState] = {}
        for n, ((m, expected, _), ok) in enumerate(zip(changes, outcomes, strict=True)):
            if ok is not False:
                continue
            with self._undecided_lock:
                earlier = self._undecided.pop((m.topic_uid, m.id, expected), None)
            if earlier is None:
                continue
            try:
                row = self.get(m.topic_uid, m.id, serial=True)
            except StoreUnavailable:
                continue  # its lease pointer brings it back when the lease runs out
            if row is not None and same_transition(row, earlier):
                found[n] = row
        return found

    def _resolve_cas(self, intended: MessageState, expected: int, timeout: Exception
                     ) -> bool | Exception:
        """A timed-out change read at SERIAL: True when the row shows it, the timeout when
        the row is still at the expected version (not applied, not lost either: the caller
        may try again), False when another change won."""
        try:
            found = self.get(intended.topic_uid, intended.id, serial=True)
        except StoreUnavailable as exc:
            return exc
        if found is not None and same_transition(found, intended):
            return True
        return timeout if found is not None and found.version == expected else False

    def stage(self, topic_uid: uuid.UUID, payloads: Sequence[PayloadRow],
              members: Sequence[tuple[str, str, int]],
              fresh: Sequence[tuple[PayloadRow, MessageState, int]] = (),
              ) -> tuple[list[Exception | None], list[Exception | None], list[Exception | None]]:
        """What an enqueue writes before its state rows, in one round of batches: payloads
        (topic_uid, id, content_hash, payload, ttl_s), one unlogged batch per home (at most
        PAYLOAD_BATCH_BYTES of payload each), and campaign memberships (campaign, id, ttl_s),
        one unlogged batch per index partition; all plain, idempotent inserts.
        `fresh` are (payload row, state row, state ttl_s) of messages with server-made ids
        and no campaign: each one's payload and state row go in the same batch of its home.
        The two tables share the partition key (topic_uid, home), so Cassandra applies such
        a batch as one mutation: no reader finds the row without its payload, and the state
        row costs no round trip of its own (insert_fresh_many explains the plain write).
        Per payload, member and fresh entry: None where written, else the error."""
        return self.start_stage(topic_uid, payloads, members, fresh).errors()

    def start_stage(self, topic_uid: uuid.UUID, payloads: Sequence[PayloadRow],
                    members: Sequence[tuple[str, str, int]],
                    fresh: Sequence[tuple[PayloadRow, MessageState, int]] = ()) -> Staging:
        """stage(), returning once its batches are sent; Staging.errors() waits for them."""
        payload_chunks, payload_batches = _payload_batches(payloads)
        member_chunks, member_batches = _member_batches(topic_uid, members)
        fresh_chunks, fresh_batches = _payload_batches([body for body, _, _ in fresh],
                                                       PLAIN_BATCH // 2)
        for chunk, batch in zip(fresh_chunks, fresh_batches, strict=True):
            batch.extend((_INSERT_FRESH, self._params(*fresh[n][1:])) for n in chunk)
        return Staging(self.db.start_batches(payload_batches + member_batches + fresh_batches),
                       (payload_chunks, member_chunks, fresh_chunks),
                       (len(payloads), len(members), len(fresh)))

    def get_payloads(self, topic_uid: uuid.UUID, keys: Sequence[tuple[str, str]]
                     ) -> dict[tuple[str, str], Payload]:
        """Payloads of (id, content_hash) pairs of one topic, by that pair (a replaced
        message has one body per version)."""
        return self.collect_payloads(self.start_payloads(topic_uid, keys))

    def start_payloads(self, topic_uid: uuid.UUID, keys: Sequence[tuple[str, str]]
                       ) -> tuple[set[tuple[str, str]], list[ResponseFuture]]:
        """Start reading payloads, one read per home (to overlap with other round trips); see
        collect_payloads."""
        wanted = set(keys)
        ids = list(dict.fromkeys(i for i, _ in keys))
        chunks = _by_home(((_home(topic_uid, i), n) for n, i in enumerate(ids)), IN_CHUNK)
        futures = [self.db.execute_async(_GET_PAYLOADS, (topic_uid, home_of(ids[c[0]]),
                                                         [ids[n] for n in c])) for c in chunks]
        return wanted, futures

    def collect_payloads(self, started: tuple[set[tuple[str, str]], list[ResponseFuture]]
                         ) -> dict[tuple[str, str], Payload]:
        wanted, futures = started
        found = {}
        for rows in self.db.results(futures):
            for r in rows:
                key = (r["id"], r["content_hash"])
                if key in wanted:
                    found[key] = Payload(r["payload"], r["encoding"], dict(r["headers"] or {}))
        return found
