"""Frequency-cap slots (table cap_slots, schema/028_frequency_caps.cql).

Guarantees: a recipient's slots share one partition, and every write of a slot is an LWT
on its row, so Paxos orders all claims of one recipient: two claims of one slot never both
apply, whichever processes send them. Nothing is deleted: a slot is given back by setting
its window_end to 0, and rows leave by TTL (their window plus a day). Times are epoch ms.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from app.store.session import CassandraSession

TTL_MARGIN_S = 86_400  # a slot row outlives its window by a day

_READ = ("SELECT slot, message_id, window_end, claimed_at, version, attempts "
         "FROM {ks}.cap_slots WHERE topic_uid = ? AND recipient = ?")
_CLAIM_NEW = ("INSERT INTO {ks}.cap_slots (topic_uid, recipient, slot, message_id, window_end, "
              "claimed_at, version, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
              "IF NOT EXISTS USING TTL ?")
_CLAIM_OVER = ("UPDATE {ks}.cap_slots USING TTL ? SET message_id = ?, window_end = ?, "
               "claimed_at = ?, version = ?, attempts = ? "
               "WHERE topic_uid = ? AND recipient = ? AND slot = ? "
               "IF message_id = ? AND claimed_at = ? AND window_end = ?")
_GIVE_BACK = ("UPDATE {ks}.cap_slots USING TTL ? SET window_end = 0 "
              "WHERE topic_uid = ? AND recipient = ? AND slot = ? "
              "IF message_id = ? AND claimed_at = ?")


@dataclasses.dataclass(frozen=True)
class Slot:
    """One slot as read: the message that claimed it at claimed_at_ms, with that message's
    row version and attempts then, counting until window_end_ms (0: given back)."""

    slot: int
    message_id: str
    window_end_ms: int
    claimed_at_ms: int
    version: int
    attempts: int

    def live(self, now_ms: int) -> bool:
        """Whether it still counts at now_ms."""
        return self.window_end_ms > now_ms


@dataclasses.dataclass(frozen=True)
class Claim:
    """What a claim writes into a slot."""

    message_id: str
    window_end_ms: int
    claimed_at_ms: int
    version: int
    attempts: int


class HandedOut:
    """Slots this process saw held by a message handed out under that claim (bounded, LRU):
    a full recipient's holders are read once, not at every take."""

    def __init__(self, size: int = 100_000) -> None:
        self._seen: collections.OrderedDict[tuple[Any, ...], None] = collections.OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def add(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def __contains__(self, key: tuple[Any, ...]) -> bool:
        with self._lock:
            return key in self._seen


class CapStore:
    """Reads and LWTs of cap_slots, and the claims this process knows were handed out."""

    def __init__(self, db: CassandraSession) -> None:
        self.db = db
        self.handed_out = HandedOut()

    def read_many(self, topic_uid: uuid.UUID, recipients: Sequence[str]
                  ) -> dict[str, dict[int, Slot]]:
        """Each recipient's slots by number (one read each, concurrently)."""
        futures = [self.db.execute_async(_READ, (topic_uid, r)) for r in recipients]
        return {r: {row["slot"]: _slot(row) for row in rows}
                for r, rows in zip(recipients, self.db.results(futures), strict=True)}

    def claim(self, topic_uid: uuid.UUID, recipient: str, slot: int, claim: Claim,
              over: Slot | None) -> bool:
        """Write claim into a slot never used (over None: IF NOT EXISTS) or over the slot
        as read (IF message_id, claimed_at and window_end are still those). True if it
        applied. An LWT that timed out raises (StoreUnavailable): its take does not run."""
        ttl = max(1, (claim.window_end_ms - claim.claimed_at_ms) // 1000 + TTL_MARGIN_S)
        if over is None:
            rows = self.db.execute(_CLAIM_NEW, (
                topic_uid, recipient, slot, claim.message_id, claim.window_end_ms,
                claim.claimed_at_ms, claim.version, claim.attempts, ttl))
        else:
            rows = self.db.execute(_CLAIM_OVER, (
                ttl, claim.message_id, claim.window_end_ms, claim.claimed_at_ms,
                claim.version, claim.attempts, topic_uid, recipient, slot,
                over.message_id, over.claimed_at_ms, over.window_end_ms))
        return bool(rows[0]["[applied]"])

    def give_back(self, topic_uid: uuid.UUID, gone: Sequence[tuple[str, Slot]]) -> list[bool]:
        """Free each (recipient, slot) if the same claim still holds it (concurrently);
        per slot whether it applied (False also when the write failed)."""
        outcomes = self.db.execute_many(_GIVE_BACK, [
            (TTL_MARGIN_S, topic_uid, r, s.slot, s.message_id, s.claimed_at_ms)
            for r, s in gone])
        return [ok and bool(rows[0]["[applied]"]) for ok, rows in outcomes]


def _slot(row: dict[str, object]) -> Slot:
    def number(name: str) -> int:
        value = row[name]
        return value if isinstance(value, int) else 0

    return Slot(number("slot"), str(row["message_id"] or ""), number("window_end"),
                number("claimed_at"), number("version"), number("attempts"))
