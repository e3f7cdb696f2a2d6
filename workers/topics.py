"""What a releaser knows of topics, and how it keeps up: every topic once at start and every
DUETIME_TOPIC_REFRESH_MS (a safety net), and in between the changes other processes write to
topic_changes, read every FOLLOW_EVERY_MS (one small read). So a topic created a moment ago is
known within about 100 ms, and 10,000 topics are not re-read every few seconds.

The first full read is made by the first step; later ones run on a thread of their own, so
a step keeps following changes while one runs (10,000 topics take a moment to read, and a
topic created then would wait for it). The step that finds one done applies it: a topic a
change brought in after the read began is not taken for gone, and the changes since then are
applied again, so a full read never undoes a change followed while it ran.
"""

from __future__ import annotations

import threading
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
        self._changed_at: dict[uuid.UUID, int] = {}  # topic -> when a change brought it (ms)
        self._read_all_at: int | None = None  # when the last full read applied began (ms)
        self._reading: _FullRead | None = None

    def step(self) -> set[uuid.UUID]:
        """Read every topic (the first time, here), or apply a full read that is done and
        start the next when it is due; then follow the recent changes. Returns the uids of
        topics that are gone; raises what a full read raised (the next step starts another)."""
        now = self.services.clock()
        gone: set[uuid.UUID] = set()
        since = now - OVERLAP_MS
        if self._read_all_at is None:
            gone = self._replace_all(self.services.topics.all(), now)
        elif self._reading is None and \
                now - self._read_all_at >= self.services.config.topic_refresh_ms:
            self._reading = _FullRead(self.services, now)
        if self._reading is not None and self._reading.done.is_set():
            reading, self._reading = self._reading, None
            gone = self._replace_all(reading.result(), reading.began_ms)
            since = min(since, reading.began_ms - OVERLAP_MS)
        for changed, tenant, name in self.services.topics.changes_since(since):
            if changed not in self._applied:
                gone |= self._apply(tenant, name, now)
                self._applied[changed] = now
        self._applied = {c: t for c, t in self._applied.items() if t >= now - 2 * OVERLAP_MS}
        return gone

    def _replace_all(self, found: list[Topic], began_ms: int) -> set[uuid.UUID]:
        """Take a full read begun at began_ms as what is known; the changes are applied
        again after it. Returns the topics gone: those it did not find that no change
        brought in since it began."""
        by_uid = {t.uid: t for t in found}
        gone = {uid for uid in self.by_uid if uid not in by_uid
                and self._changed_at.get(uid, began_ms - 1) < began_ms}
        for uid in gone:
            del self.by_uid[uid]
        self.by_uid.update(by_uid)
        self._uid_of = {(t.tenant, t.name): uid for uid, t in self.by_uid.items()}
        self._read_all_at, self._applied, self._changed_at = began_ms, {}, {}
        return gone

    def _apply(self, tenant: str, name: str, now: int) -> set[uuid.UUID]:
        topic = self.services.topics.get(tenant, name)
        held = self._uid_of.get((tenant, name))
        gone = {held} if held is not None and (topic is None or held != topic.uid) else set()
        for uid in gone:
            del self.by_uid[uid]
            del self._uid_of[(tenant, name)]
            self._changed_at.pop(uid, None)
        if topic is not None:
            self.by_uid[topic.uid] = topic
            self._uid_of[(tenant, name)] = topic.uid
            self._changed_at[topic.uid] = now
        return gone


class _FullRead:
    """One read of every topic, begun at began_ms (epoch ms), on a daemon thread of its own."""

    def __init__(self, services: Services, began_ms: int) -> None:
        self.services = services
        self.began_ms = began_ms
        self.done = threading.Event()
        self._found: list[Topic] = []
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="topics-read-all", daemon=True).start()

    def _run(self) -> None:
        try:
            self._found = self.services.topics.all()
        except BaseException as exc:  # raised by the step that takes it
            self._error = exc
        finally:
            self.done.set()

    def result(self) -> list[Topic]:
        if self._error is not None:
            raise self._error
        return self._found
