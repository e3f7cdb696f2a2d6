"""Produces the fires of the schedules whose release slot this releaser owns.

What it costs when nothing fires: one read of the slots' marks
(app.store.schedules.ScheduleStore.marks) when a process that changed a listing woke it
(app.delivery.wakeups "schedules"), when the owned slots changed, or when the releaser's
ownership tick wakes it every MARKS_EVERY_MS, the safety net of a lost wake-up; a slot's
listing is read again only when its mark moved, when the slot became ours, or every RELIST_MS;
a schedule's row only when its listed version moved. Schedules are kept in memory with their
cursor, so a tick walks them without a round trip and produces those due within
app.schedules.manage.AHEAD_MS together, per topic, in steps of PRODUCE_STEP
(app.schedules.manage.produce); when many fires come close together it starts earlier, by what
it takes to make them (ScheduleRunner.due).
Exactly once holds whoever runs it: fires have deterministic ids and cursors move by LWT
from the value read.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from app.core.chunks import chunked
from app.errors import DuetimeError
from app.models import Topic
from app.schedules import manage as schedules
from app.services import Services
from app.store.schedules import Schedule

log = logging.getLogger("duetime.schedules")
PRODUCERS = 4  # steps produced at once: each is a few batched round trips
PRODUCE_STEP = 1000  # schedules of one topic produced by one step
RELIST_MS = 60_000  # owned slots' listings are read again at least this often
MARKS_EVERY_MS = 5000  # the releaser's tick wakes the runner this often (workers.releaser)
MAX_LEAD_MS = 30_000  # how far ahead a crowd of fires may start being made
MIN_RATE = 100.0  # fires/s assumed at worst when planning a crowd's lead
PLAN_MARGIN = 2.0  # a crowd is planned at half the rate measured: rates vary tick to tick

Key = tuple[uuid.UUID, str]


class ScheduleRunner:
    def __init__(self, services: Services, owned: Callable[[], frozenset[int]],
                 topic_of: Callable[[uuid.UUID], Topic | None]) -> None:
        self.services = services
        self.owned = owned
        self.topic_of = topic_of
        self._listed: dict[int, dict[Key, int]] = {}  # slot -> schedule -> version listed
        self._marks: dict[int, uuid.UUID | None] = {}  # slot -> mark when last listed
        self._listed_at = 0
        self._woken = threading.Event()
        self._known: dict[Key, Schedule] = {}  # as last read or produced
        self._pool = ThreadPoolExecutor(PRODUCERS, thread_name_prefix="schedule")
        self.rate = 1000.0  # fires/s this runner makes (measured on crowds)
        self._stale: set[Key] = set()  # listed at a version not read yet

    def tick(self) -> None:
        if self._refresh_listing():
            listed = {key: version for slot in self._listed.values()
                      for key, version in slot.items()}
            for key in [k for k in self._known if k not in listed]:
                del self._known[key]  # deleted, or its slot is no longer ours
            self._stale = {key for key, version in listed.items()
                           if key not in self._known or self._known[key].version != version}
        if self._stale:
            reading = sorted(self._stale)
            self._read(reading)
            self._stale.difference_update(reading)
        now = self.services.clock()
        due: dict[uuid.UUID, list[Schedule]] = defaultdict(list)
        for s in self.due(now):
            due[s.topic_uid].append(s)
        steps = [(topic_uid, chunk) for topic_uid, found in due.items()
                 for chunk in chunked(found, PRODUCE_STEP)]
        began = time.monotonic()
        made = sum(self._pool.map(self._safe_produce, steps))  # made together
        if made >= PRODUCE_STEP:  # a rate measured on a handful would be mostly latency
            rate = made / max(time.monotonic() - began, 1e-3)
            self.rate = max(MIN_RATE, (self.rate + rate) / 2)

    def due(self, now: int) -> list[Schedule]:
        """The schedules to produce now: those whose next fire is within AHEAD_MS, and
        earlier ones when many fires come close together: the k-th fire (by time) within
        MAX_LEAD_MS starts AHEAD_MS + k / (rate / PLAN_MARGIN) before its time, so the fires
        of a busy minute are made before it, not after (rate: fires per second this runner
        made)."""
        near = sorted((s for s in self._known.values()
                       if s.next_fire is not None and s.next_fire <= now + MAX_LEAD_MS),
                      key=lambda s: s.next_fire or 0)
        rate = self.rate / PLAN_MARGIN
        return [s for k, s in enumerate(near, start=1)
                if (s.next_fire or 0) - schedules.AHEAD_MS - 1000 * k / rate <= now]

    def stop(self) -> None:
        """After the last tick: end the producer threads (a tick still running past the
        releaser's stop bound finds its work cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """A listing changed (app.delivery.wakeups): read the marks at the next tick."""
        self._woken.set()

    def _refresh_listing(self) -> bool:
        """Read the listings of owned slots that changed; True when any listing did."""
        owned = sorted(self.owned())
        now = self.services.clock()
        if not self._woken.is_set() and set(owned) == set(self._listed):
            return False
        self._woken.clear()  # before the read: a wake-up during it reads again
        try:
            marks = self.services.schedules.marks()
        except DuetimeError:
            self._woken.set()  # not read: the next tick tries again
            raise
        if now - self._listed_at >= RELIST_MS:
            self._marks, self._listed_at = {}, now
        changed = [slot for slot in owned
                   if slot not in self._marks or self._marks[slot] != marks.get(slot)]
        gone = [s for s in self._listed if s not in owned]
        for slot in gone:
            del self._listed[slot]
            self._marks.pop(slot, None)
        if changed:
            found: dict[int, dict[Key, int]] = {slot: {} for slot in changed}
            for slot, topic_uid, name, version in self.services.schedules.in_slots(changed):
                found[slot][(topic_uid, name)] = version
            for slot in changed:  # the mark read before the listing: a later move re-reads
                self._listed[slot], self._marks[slot] = found[slot], marks.get(slot)
        return bool(changed or gone)

    def _read(self, keys: list[Key]) -> None:
        by_topic: dict[uuid.UUID, list[str]] = defaultdict(list)
        for topic_uid, name in keys:
            by_topic[topic_uid].append(name)
        for topic_uid, names in by_topic.items():
            found = self.services.schedules.get_many(topic_uid, names)
            for name in names:
                if name in found:
                    self._known[(topic_uid, name)] = found[name]
                else:  # deleted; its listing goes at the next mark
                    self._known.pop((topic_uid, name), None)

    def _safe_produce(self, step: tuple[uuid.UUID, list[Schedule]]) -> int:
        """Produce one step; returns how many schedules it moved on."""
        topic_uid, due = step
        ahead = max((s.next_fire or 0) for s in due) - self.services.clock()
        try:
            topic = self.topic_of(topic_uid)
            if topic is None:
                return 0  # a topic not known here yet: the next tick tries again
            after = schedules.produce(self.services, topic, due, ahead)
        except DuetimeError as exc:  # log and continue: the next tick tries again
            log.warning("schedules of topic %s: %s", topic_uid, exc.detail)
            return 0
        for s, now in zip(due, after, strict=True):
            key = (topic_uid, s.name)
            if now is None:
                self._known.pop(key, None)
            else:
                self._known[key] = now
        return sum(1 for s, now in zip(due, after, strict=True) if now != s)
