"""Background operations (of a campaign, or of the messages a filter matches): their rows
(LWT only) and the list of unfinished ones.

Guarantees:
- one process runs an operation at a time: claim applies only while the operation runs and
  its lease has passed (IF state = 'running' AND lease_until < now); every checkpoint and the
  finish apply only for the owner that claimed it (IF owner = ?), so a process that lost its
  claim (paused past its lease, partitioned) learns so at its next write and stops;
- a checkpoint stores the progress counts together with the position they are counts of, so a
  resumed run continues from there with counts that match it;
- pending_operations lists every operation enlisted and not finished (plain writes: a row is
  inserted once the operation is recorded and marked on its campaign, and deleted once it
  has finished).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from app.core.timeparse import cql_ms
from app.store.session import CassandraSession

PENDING_PART = 0  # all unfinished operations share one small partition
_COLUMNS = ("topic_uid", "id", "tenant", "topic", "kind", "campaign", "state", "shift_ms",
            "processed", "changed", "delivering", "new_gen", "walked", "after_id", "not_before",
            "owner", "lease_until", "started_at", "finished_at", "error", "filter", "page_ids")
_TIMES = {"not_before", "lease_until", "started_at", "finished_at"}


@dataclasses.dataclass(frozen=True)
class Operation:
    """One cancel, shift, pause or resume of a campaign, or of the messages a filter matches.
    Times epoch ms; shift_ms a duration in ms. Progress: processed messages looked at (members
    of the campaign index, or matches of the filter), changed messages, delivering (handed out
    when a cancel reached them). Position: the last id of the campaign index done, or for a
    filter the search's page token after the last page done (after_id); whether the walk is
    over (walked). A filtered operation has campaign None and its filter as canonical JSON
    (app.messages.filtered_ops); page_ids are the ids of the page being applied (None between
    pages)."""

    topic_uid: uuid.UUID
    id: uuid.UUID
    tenant: str
    topic: str
    kind: str
    campaign: str | None
    state: str = "running"
    shift_ms: int = 0
    processed: int = 0
    changed: int = 0
    delivering: int = 0
    new_gen: int | None = None
    walked: bool = False
    after_id: str = ""
    not_before: int = 0
    owner: str | None = None
    lease_until: int = 0
    started_at: int = 0
    finished_at: int | None = None
    error: str | None = None
    filter: str | None = None
    page_ids: tuple[str, ...] | None = None


def _operation(row: dict[str, Any]) -> Operation:
    values: dict[str, Any] = {
        c: (cql_ms(row[c]) if c in _TIMES and row[c] is not None else row[c]) for c in _COLUMNS}
    for name in ("processed", "changed", "delivering", "shift_ms", "not_before", "lease_until"):
        values[name] = values[name] or 0
    values["walked"] = bool(values["walked"])
    values["after_id"] = values["after_id"] or ""
    values["page_ids"] = None if values["page_ids"] is None else tuple(values["page_ids"])
    return Operation(**values)


def _stored(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class OperationStore:
    def __init__(self, db: CassandraSession) -> None:
        self.db = db

    def record(self, op: Operation) -> None:
        """Write a new operation's row (not yet listed for the runners)."""
        values = [_stored(getattr(op, c)) for c in _COLUMNS]
        self.db.execute(
            f"INSERT INTO {{ks}}.operations ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in _COLUMNS)}) IF NOT EXISTS", values)

    def enlist(self, op: Operation) -> None:
        """List a recorded operation for the runners."""
        self.db.execute("INSERT INTO {ks}.pending_operations (part, id, topic_uid) "
                        "VALUES (?, ?, ?)", (PENDING_PART, op.id, op.topic_uid))

    def get(self, topic_uid: uuid.UUID, op_id: uuid.UUID, serial: bool = False
            ) -> Operation | None:
        level = self.db.serial_level if serial else None
        rows = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM {{ks}}.operations WHERE topic_uid = ? AND id = ?",
            (topic_uid, op_id), consistency=level)
        return _operation(rows[0]) if rows else None

    def pending(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """(topic_uid, operation id) of every unfinished operation."""
        rows = self.db.execute(
            "SELECT topic_uid, id FROM {ks}.pending_operations WHERE part = ?", (PENDING_PART,))
        return [(r["topic_uid"], r["id"]) for r in rows]

    def claim(self, op: Operation, owner: str, lease_until_ms: int, now_ms: int) -> bool:
        """Become the operation's runner, if it runs and nobody's lease on it is current."""
        rows = self.db.execute(
            "UPDATE {ks}.operations SET owner = ?, lease_until = ? WHERE topic_uid = ? AND id = ? "
            "IF state = 'running' AND lease_until < ?",
            (owner, lease_until_ms, op.topic_uid, op.id, now_ms))
        return bool(rows[0]["[applied]"])

    def checkpoint(self, op: Operation, lease_until_ms: int) -> bool:
        """Store op's progress and position (and the page it is applying, if any) and renew
        its runner's lease; False when op.owner no longer holds it."""
        rows = self.db.execute(
            "UPDATE {ks}.operations SET processed = ?, changed = ?, delivering = ?, walked = ?, "
            "after_id = ?, page_ids = ?, lease_until = ? WHERE topic_uid = ? AND id = ? "
            "IF owner = ? AND state = 'running'",
            (op.processed, op.changed, op.delivering, op.walked, op.after_id,
             _stored(op.page_ids), lease_until_ms, op.topic_uid, op.id, op.owner))
        return bool(rows[0]["[applied]"])

    def finish(self, op: Operation, state: str, error: str | None, now_ms: int) -> bool:
        """End the operation as succeeded or failed with its final counts (only for its
        owner), then unlist it."""
        rows = self.db.execute(
            "UPDATE {ks}.operations SET state = ?, error = ?, finished_at = ?, processed = ?, "
            "changed = ?, delivering = ? WHERE topic_uid = ? AND id = ? "
            "IF owner = ? AND state = 'running'",
            (state, error, now_ms, op.processed, op.changed, op.delivering,
             op.topic_uid, op.id, op.owner))
        applied = bool(rows[0]["[applied]"])
        if applied:
            self.unlist(op.id)
        return applied

    def unlist(self, op_id: uuid.UUID) -> None:
        """Remove a finished (or vanished) operation from the pending list."""
        self.db.execute("DELETE FROM {ks}.pending_operations WHERE part = ? AND id = ?",
                        (PENDING_PART, op_id))
