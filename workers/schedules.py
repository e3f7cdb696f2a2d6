"""Produces the fires of the schedules whose release slot this releaser owns.

Every tick it reads the schedule lists of its owned slots (one small read per slot) and
re-reads a schedule only when its version moved or its next fire is within
app.schedules.AHEAD_MS; then it produces what is due (app.schedules.produce). Exactly once
holds whoever runs it: fires have deterministic ids and the cursor moves by LWT.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app import schedules
from app.errors import DuetimeError
from app.models import Topic
from app.services import Services

log = logging.getLogger("duetime.schedules")
PRODUCERS = 16  # schedules produced at once: each step is a few round trips

Key = tuple[uuid.UUID, str]


class ScheduleRunner:
    def __init__(self, services: Services, owned: Callable[[], frozenset[int]],
                 topic_of: Callable[[uuid.UUID], Topic | None]) -> None:
        self.services = services
        self.owned = owned
        self.topic_of = topic_of
        self._known: dict[Key, tuple[int, int | None]] = {}  # version, next fire
        self._pool = ThreadPoolExecutor(PRODUCERS, thread_name_prefix="schedule")

    def tick(self) -> None:
        listed = self.services.schedules.in_slots(sorted(self.owned()))
        now = self.services.clock()
        todo = []
        for topic_uid, name, version in listed:
            known = self._known.get((topic_uid, name))
            if known is None or known[0] != version or (
                    known[1] is not None and known[1] - schedules.AHEAD_MS <= now):
                todo.append((topic_uid, name))
        list(self._pool.map(self._safe_step, todo))  # a minute's fires are made together
        listed_keys = {(t, n) for t, n, _ in listed}
        for key in [k for k in self._known if k not in listed_keys]:
            del self._known[key]  # deleted, or its slot is no longer ours

    def stop(self) -> None:
        """After the last tick: end the producer threads."""
        self._pool.shutdown(wait=True)

    def _safe_step(self, key: Key) -> None:
        try:
            self._step(*key)
        except DuetimeError as exc:  # log and continue: the next tick tries again
            log.warning("schedule %s of topic %s: %s", key[1], key[0], exc.detail)

    def _step(self, topic_uid: uuid.UUID, name: str) -> None:
        s = self.services.schedules.get(topic_uid, name)
        topic = self.topic_of(topic_uid)
        if s is None or topic is None:
            return  # deleted (its listing goes next), or a topic not known here yet
        if s.next_fire is not None and s.next_fire - schedules.AHEAD_MS <= self.services.clock():
            s = schedules.produce(self.services, topic, s)
        if s is not None:
            self._known[(topic_uid, name)] = (s.version, s.next_fire)
