"""What a releaser knows of topics, and how it keeps up: every topic once at start and every
DUETIME_TOPIC_REFRESH_MS (a safety net), and in between the changes other processes write to
topic_changes, read every FOLLOW_EVERY_MS (one small read). So a topic created a moment ago is
known within about 100 ms, and 10,000 topics are not re-read every few seconds.

One step does both (KnownTopics.step), so a full read never undoes a change followed while
it ran: after a full read, the changes of the last OVERLAP_MS are applied again.
"""

from __future__ import annotations

import uuid

from app.models import Topic
from app.services import Services

FOLLOW_EVERY_MS = 100
# A change becomes visible up to this long after its time (a slow write, an API host's clock
# behind): each read looks back this far and skips the changes it already applied.
OVERLAP_MS = 5000


class KnownTopics:
    """The topics by uid, kept in `by_uid` (a dict others read; changed in place by step()).
    Not for concurrent step() calls."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.by_uid: dict[uuid.UUID, Topic] = {}
        self._applied: dict[uuid.UUID, int] = {}  # change id -> when applied (ms)
        # the uid held for each (tenant, name): a change finds its topic without a walk of
        # every topic (10,000 created in a burst would each have walked them all)
        self._uid_of: dict[tuple[str, str], uuid.UUID] = {}
        self._read_all_at: int | None = None

    def step(self) -> set[uuid.UUID]:
        """Read every topic if a full read is due, then follow the recent changes. Returns
        the uids of topics that are gone."""
        now = self.services.clock()
        gone: set[uuid.UUID] = set()
        if self._read_all_at is None or \
                now - self._read_all_at >= self.services.config.topic_refresh_ms:
            found = {t.uid: t for t in self.services.topics.all()}
            gone = {uid for uid in self.by_uid if uid not in found}
            for uid in gone:
                del self.by_uid[uid]
            self.by_uid.update(found)
            self._uid_of = {(t.tenant, t.name): uid for uid, t in self.by_uid.items()}
            self._read_all_at, self._applied = now, {}
        for changed, tenant, name in self.services.topics.changes_since(now - OVERLAP_MS):
            if changed not in self._applied:
                gone |= self._apply(tenant, name)
                self._applied[changed] = now
        self._applied = {c: t for c, t in self._applied.items() if t >= now - 2 * OVERLAP_MS}
        return gone

    def _apply(self, tenant: str, name: str) -> set[uuid.UUID]:
        topic = self.services.topics.get(tenant, name)
        held = self._uid_of.get((tenant, name))
        gone = {held} if held is not None and (topic is None or held != topic.uid) else set()
        for uid in gone:
            del self.by_uid[uid]
            del self._uid_of[(tenant, name)]
        if topic is not None:
            self.by_uid[topic.uid] = topic
            self._uid_of[(tenant, name)] = topic.uid
        return gone
