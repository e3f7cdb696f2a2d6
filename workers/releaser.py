"""`duetime-admin releaser`: walks the owned shards of the timeline and releases due messages.

Its steps are idempotent. Three run on threads of their own at two paces (workers/paced.py):
soon after a wake-up (app.delivery.wakeups: a datagram another process sends after a write the step
must see) and otherwise every idle period, a safety net that costs a few reads a second for
the whole releaser. The others are periodic jobs (APScheduler). The ownership tick owns the
idle runs: after its own reads it wakes each step whose idle period (in whole ticks) has
passed, so an idle releaser's reads reach Cassandra at one instant a tick; each instant costs
the node about 5 ms of CPU however few requests it holds.
- tick (every lease/3): heartbeat, renew, rebalance release slots (workers/ownership.py), then
  the steps' idle runs;
- topics (woken by "topics": FOLLOW_EVERY_MS; idle: IDLE_EVERY_MS): the changes of topics
  other processes wrote, and every topic_refresh_ms the whole list, so new topics start at
  once and deleted ones stop;
- walk (woken by "due:<topic>": release_rescan_ms; idle: release_idle_ms): per owned shard
  of each topic a position in memory (workers/walk.py), started at the shard's durable
  cursor; pointers due up to the reach (now + COUNTED_AHEAD_MS less the safety lag) go to
  the broker, which takes them in rounds for lease calls (pull topics) or for the POST pool
  (webhook topics: workers/broker.py, workers/push.py). A step woken by wake-ups reads
  only the topics they named (and those whose take failed); every PASS_EVERY_MS a step
  looks at every topic listed in active_topics for the window's buckets, so a lost wake-up
  costs at most that. Of the
  topics a step looks at, only those where a write count (bucket_writes) moved since the
  last read, or whose position nears now + look-ahead, are read; all counts are read in
  one round trip (workers/count_reads.py). A write that lands behind a position is placed
  again by its writer (app.messages.placement), so nothing searches behind the positions.
  It writes the durable cursors, never past a message held;
- schedules (SCHEDULES_EVERY_MS): produce the fires of the schedules of the owned slots
  (workers/schedules.py; their listings are read again when "schedules" wakes it);
- operations (woken by "operations": OPERATIONS_EVERY_MS; idle: IDLE_EVERY_MS): run pending
  campaign operations (workers/operations.py);
- clock (the tick, every CLOCK_EVERY_MS): this clock against Cassandra's and against the other
  releasers' (app.ops.clock_skew), gauges and a warning past half the safety lag.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import secrets
import signal
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import start_http_server

from app.config import Config
from app.core.timeline import COUNTED_AHEAD_MS, bucket_of, release_slot_of
from app.delivery import wakeups
from app.errors import StoreUnavailable
from app.models import Pointer, Topic
from app.ops import clock_skew, metrics
from app.services import Services
from app.store.ownership import OwnershipStore
from workers.broker import HELD_PER_LANE, Broker
from workers.count_reads import Counts, read_counts
from workers.operations import OperationRunner
from workers.ownership import RENEW_FRACTION, SlotOwnership
from workers.paced import PacedStep
from workers.push import PushDispatcher
from workers.schedules import MARKS_EVERY_MS, ScheduleRunner
from workers.topics import FOLLOW_EVERY_MS, KnownTopics
from workers.wake_listener import WakeListener
from workers.walk import Walk

# the walk looks at the active topics this often: their counts, and a turn of the quiet
# ones (all of them after a claim) to start their walks and move their positions; in
# between only at the topics wake-ups named, new ones and those whose take failed
PASS_EVERY_MS = 1000
# a quiet topic is looked at every this many passes: its position stays within the window
# (WINDOW_BACK_MS), and a pass costs the active topics, not every topic
QUIET_TURNS = 20
# the walk's window starts this far before now: the buckets whose write counts it compares,
# and how far behind now a position may be and still pass an empty stretch without a read
WINDOW_BACK_MS = 60_000
WALK_READERS = 8
# a read of a webhook topic finds at most this many waiting messages (a burst is read on at
# the next step); a pull topic's reads are bounded by its broker's room
PUSH_READ_MAX = 5000
REPORT_EVERY_MS = 10_000
CLOCK_EVERY_MS = 10_000
# A cursor is written only when it moves this far: a busy topic costs a write per shard
# every 5 s, not every step, and a new walk re-reads at most this much of spent timeline.
CURSOR_STEP_MS = 5000
OPERATIONS_EVERY_MS = 1000
SCHEDULES_EVERY_MS = 500
# Without a wake-up, topics and operations run this often.
IDLE_EVERY_MS = 5000
# A new releaser polls at the busy paces until every process has read its wake address.
WARM_MS = 2 * wakeups.ADDRESSES_EVERY_MS
MAX_ASKED = 10_000
UNAVAILABLE_WARN_EVERY_S = 10
MAX_SLOT_MAPS = 200_000
# a run under way when a topic is deleted ends well within this (seconds at worst)
FORGET_AFTER_GONE_S = 60.0
# stop() waits this long for the runs under way (steps and jobs) after asking them to end;
# a run still going then is left on its daemon thread, named in the log
STOP_RUNS_S = 15.0
BIND_TRIES = 20
log = logging.getLogger("duetime.releaser")
# releasers started in this process and not stopped yet (tests check none is left behind)
_running: set[Releaser] = set()
_running_lock = threading.Lock()


def running_releasers() -> list[Releaser]:
    """The releasers of this process that were started and not stopped yet."""
    with _running_lock:
        return list(_running)


def whole_ticks(period_ms: int, lease_ms: int) -> int:
    """A period in whole ownership ticks (lease_ms / RENEW_FRACTION each), at least one: a
    period shorter than the tick is served at the tick. Integer arithmetic: 5 s of a 5 s
    lease is 3 ticks, which 5000 // (5000 / 3) in floats makes 2."""
    return max(1, period_ms * RENEW_FRACTION // lease_ms)


def all_done(futures: list[Future[Any]]) -> None:
    """Wait until every one has ended (or was cancelled by a stop), then raise the first
    one's failure (in their order), if any: a run does not end while work it started still
    runs. Future by future, not concurrent.futures.wait: a future cancelled by the pool's
    shutdown(cancel_futures=True) never wakes wait()."""
    first: Exception | None = None
    for future in futures:
        try:
            future.result()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


def bind_listeners(config: Config, broker: Broker) -> WakeListener:
    """The broker's TCP socket and the wake-ups' UDP socket, bound on one port number (the
    one address published). With DUETIME_WAKE_PORT 0 the TCP port is any free one, and
    another is tried while its number is taken for UDP; a taken fixed port raises OSError,
    for a releaser that cannot serve its shards' pull topics must not own them."""
    for _ in range(BIND_TRIES):
        port = broker.bind(config.wake_port)
        try:
            return WakeListener(config, port)
        except OSError:
            broker.unbind()
            if config.wake_port:
                raise
    raise OSError(f"no port free for both TCP and UDP in {BIND_TRIES} tries")


class Releaser:
    def __init__(self, services: Services, member: str | None = None) -> None:
        cfg = services.config
        self.services = services
        self.member = member or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._known = KnownTopics(services)
        self._topics: dict[uuid.UUID, Topic] = self._known.by_uid  # read by the jobs below
        broker_token = secrets.token_urlsafe(24)  # new at every start: a restart revokes it
        self.broker = Broker(services, broker_token, self._topics.get, self._shards_owned,
                             lambda uid: self._following.wake(), self.read_now,
                             self._read_again)
        self.wakes = bind_listeners(cfg, self.broker)
        self.tick_ms = cfg.release_lease_ms / RENEW_FRACTION
        self._tick_count = 0
        self.ownership = SlotOwnership(OwnershipStore(services.db, cfg.release_ring), self.member,
                                       cfg.release_slots, cfg.release_lease_ms, services.clock,
                                       self.wakes.address, broker_token, self._gained_slots,
                                       self._gave_back_slots)
        self._unavailable_warned: dict[str, float] = {}  # step -> when last warned
        self._walks: dict[uuid.UUID, Walk] = {}  # per topic with owned shards
        self._cursors_at = 0  # when the walk last wrote cursors (epoch ms)
        # when the walk's last pass began (epoch ms), and whether the next looks at every topic
        self._passed_at = 0
        self._everyone = True
        self._turn = 0  # passes since start: which turn of the quiet topics the next looks at
        # a shard is read on once its position is this near now + look-ahead: half what the
        # look-ahead leaves after an idle period, so a pointer already there is read at least
        # that long before it is due (1.5 s of 5, with the defaults)
        self._refill_ms = max(cfg.release_rescan_ms,
                              (cfg.release_lookahead_ms - cfg.release_idle_ms) // 2)
        # the walk reads its topics this many at a time: one after another, 130 topics
        # written to between steps made each step take seconds of round trips
        self._readers = ThreadPoolExecutor(WALK_READERS, thread_name_prefix="walk")
        self._last_gone = -math.inf  # when follow_topics last saw a topic deleted (monotonic s)
        self._slot_maps: dict[tuple[uuid.UUID, int], dict[int, int]] = {}
        self._asked: set[uuid.UUID] = set()  # active topics not known: followed once each
        # (topic, shard, due ms) of pointers whose take failed: the next walk step reads them
        self._again: deque[tuple[uuid.UUID, int, int]] = deque()
        # topics a wake-up named since the walk's last step: its next step reads them
        self._named: set[uuid.UUID] = set()
        self._named_lock = threading.Lock()
        self.push = PushDispatcher(services, self.member, self.broker.room_freed,
                                   self._read_again)
        self.broker.push = self.push
        self._stopping = threading.Event()  # set first: long steps end at their next check
        self.operations = OperationRunner(services, self.member, self._stopping.is_set)
        self.schedules = ScheduleRunner(services, self.ownership.owned, self._topics.get)
        # the threads running a step or job now (_safely), waited for by stop()
        self._runs: Counter[threading.Thread] = Counter()
        self._runs_changed = threading.Condition()
        self.scheduler = BackgroundScheduler(job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._following = PacedStep("topics", self.follow_topics, FOLLOW_EVERY_MS,
                                    self._ticks(IDLE_EVERY_MS), self._safely, WARM_MS)
        self._walking = PacedStep("walk", self.walk, cfg.release_rescan_ms,
                                  self._ticks(cfg.release_idle_ms), self._safely, WARM_MS)
        self._operating = PacedStep("operations", self.run_operations, OPERATIONS_EVERY_MS,
                                    self._ticks(IDLE_EVERY_MS), self._safely, WARM_MS)
        self.paced = [self._following, self._walking, self._operating]
        self.wakes.on("topics", self._following.wake)
        self.wakes.on("due", self._walk_everyone)  # from a process older than due:<topic>
        self.wakes.on_named(wakeups.DUE, self._due_woken)
        self.wakes.on("schedules", self.schedules.wake)
        self.wakes.on("operations", self._operating.wake)
        self.wakes.on("slots", self._claim_share_now)

    def start(self) -> None:
        with _running_lock:
            _running.add(self)
        # the broker listens before the first tick publishes its address: an API process
        # that reads it then and finds the port closed would not try again for a while
        self.wakes.start()
        self.broker.start()
        self._safely(self.ownership.tick)
        self._safely(self.follow_topics)
        jobs = [(self.tick, self.tick_ms),
                (self.report, REPORT_EVERY_MS),
                (self.produce_fires, SCHEDULES_EVERY_MS)]
        for job, every_ms in jobs:
            self.scheduler.add_job(self._safely, "interval", seconds=every_ms / 1000,
                                   args=[job], id=job.__name__)
        self.scheduler.start()
        for step in self.paced:
            step.start()
        log.info("releaser %s started", self.member)

    def _ticks(self, idle_ms: int) -> int:
        return whole_ticks(idle_ms, self.services.config.release_lease_ms)

    def tick(self) -> None:
        """The ownership tick (workers/ownership.py), then the idle work it owns, right after
        its reads (also when they failed), so an idle releaser polls at one instant a tick:
        each step that has not run for its idle period runs now, the schedules read their
        listings' marks every MARKS_EVERY_MS and the clocks are checked every
        CLOCK_EVERY_MS."""
        self._tick_count += 1
        metrics.flush_collections()
        try:
            self.ownership.tick()
        finally:
            for step in self.paced:
                step.tick()
            if self._tick_count % self._ticks(MARKS_EVERY_MS) == 0:
                self.schedules.wake()
            if self._tick_count % self._ticks(CLOCK_EVERY_MS) == 0:
                self._safely(self.check_clock)

    def _safely(self, job: Callable[[], bool | None]) -> bool | None:
        """Log and continue: one failing step never stops the releaser. Cassandra being
        unreachable is one warning line per step every UNAVAILABLE_WARN_EVERY_S, not a
        traceback every run (the walk runs 20 times a second)."""
        name = getattr(job, "__name__", str(job))
        me = threading.current_thread()
        with self._runs_changed:
            self._runs[me] += 1
        try:
            return job()
        except StoreUnavailable as exc:
            now = time.monotonic()
            if now - self._unavailable_warned.get(name, -UNAVAILABLE_WARN_EVERY_S) >= \
                    UNAVAILABLE_WARN_EVERY_S:
                self._unavailable_warned[name] = now
                log.warning("releaser step %s skipped: %s", name, exc.detail)
        except Exception:
            if not self._stopping.is_set():  # a run cut short by stop() is not a failure
                log.exception("releaser step %s failed", name)
        finally:
            with self._runs_changed:
                self._runs[me] -= 1
                if not self._runs[me]:
                    del self._runs[me]
                self._runs_changed.notify_all()
        return None

    def _await_runs(self, within_s: float) -> None:
        """Wait until no step or job runs, at most within_s; name the threads of the runs
        still going then (they end at their next check of _stopping or Cassandra call)."""
        with self._runs_changed:
            if self._runs_changed.wait_for(lambda: not self._runs, within_s):
                return
            going = sorted(t.name for t in self._runs)
        log.warning("releaser %s: runs still going after %.0f s, left on their threads: %s",
                    self.member, within_s, ", ".join(going))

    def report(self) -> None:
        """One log line of what this releaser holds and has done (for operators)."""
        log.info("releaser %s slots=%d held=%d %s", self.member,
                 len(self.ownership.owned()), sum(map(len, list(self.broker.held.values()))),
                 " ".join(f"{k}={v}" for k, v in self.push.stats().items()))

    def run_operations(self) -> bool:
        """Run the pending operations; busy (run again soon) when one finished."""
        return self.operations.tick() > 0

    def check_clock(self) -> None:
        """This clock against Cassandra's, published for the other processes, then against
        every other live releaser's."""
        skew = clock_skew.measure_ms(self.services)
        self.services.clocks.report(self.member, skew, self.services.clock())
        clock_skew.releaser_gap_ms(self.services, skew, self.member)

    def _gained_slots(self) -> None:
        """A slot was claimed (start, failover, rebalance): its due pointers, cursors,
        operations and schedules are this releaser's now, so every step looks at once; the
        walk starts the slot's shards at their durable cursors, which the last owner never
        wrote past a message it held."""
        self._everyone = True
        for step in self.paced:
            step.wake()
        self.schedules.wake()

    def _gave_back_slots(self) -> None:
        """Slots were handed back: the other releasers claim them at once ("slots" wake-up),
        read from the membership now, since a releaser that just joined is the one that
        should claim them."""
        self.services.waker.refresh_addresses()
        self.services.waker.wake("slots")

    def _claim_share_now(self) -> None:
        """On the wake listener's thread: run the claim on the scheduler's, off this one."""
        if self._stopping.is_set():
            return
        self.scheduler.add_job(self._safely, args=[self.ownership.claim_share],
                               id="claim_share", replace_existing=True)

    def produce_fires(self) -> None:
        self.schedules.tick()

    def follow_topics(self) -> None:
        """New, changed and deleted topics (workers.topics.KnownTopics); an outage is logged
        by _safely, as for every step. New topics wake the walk, which reads them at its next
        step: a message of a topic created a moment ago may already be due. For
        FORGET_AFTER_GONE_S after a deletion it also drops what a step under way then
        recorded of the deleted topic."""
        before = set(self._topics)
        gone = self._known.step()
        if gone:
            self._last_gone = time.monotonic()
        for uid in gone:  # what the steps recorded of a deleted topic
            self._walks.pop(uid, None)
            self.broker.forget(uid)
        new = [uid for uid in self._topics if uid not in before]
        if new:  # the walk's next step starts their walks
            with self._named_lock:
                self._named.update(new)
            self._walking.wake()
        if time.monotonic() - self._last_gone < FORGET_AFTER_GONE_S:
            self._forget_gone()

    def _owned_shards(self, topics: Iterable[Topic] | None = None
                      ) -> Iterator[tuple[Topic, dict[int, int]]]:
        """(topic, {shard: release slot}) for every topic (of `topics`, else all) with a
        shard this releaser owns. A topic's slots are computed once per shard count: with
        10,000 topics, hashing every shard on every 50 ms step cost most of a core."""
        owned = self.ownership.owned()
        for topic in list(self._topics.values()) if topics is None else topics:
            mine = {s: slot for s, slot in self._slots_of(topic).items() if slot in owned}
            if mine:
                yield topic, mine

    def _shards_owned(self, topic: Topic) -> set[int]:
        """The topic's shards whose release slot this releaser holds now; for a webhook topic
        also those of a slot it handed back less than a tick ago (SlotOwnership.may_take:
        what it held there is due before the new owner's first walk step may find it)."""
        if topic.pushed:
            may = self.ownership.may_take
            return {s for s, slot in self._slots_of(topic).items() if may(slot)}
        owned = self.ownership.owned()
        return {s for s, slot in self._slots_of(topic).items() if slot in owned}

    def _slots_of(self, topic: Topic) -> dict[int, int]:
        """{shard: release slot} of a topic (cached)."""
        key = (topic.uid, topic.settings.shards)
        found = self._slot_maps.get(key)
        if found is None:
            slots = self.services.config.release_slots
            found = {s: release_slot_of(str(topic.uid), s, slots)
                     for s in range(topic.settings.shards)}
            if len(self._slot_maps) > MAX_SLOT_MAPS:
                self._slot_maps.clear()
            self._slot_maps[key] = found
        return found

    def walk(self) -> None:
        """One step of the walk (workers.walk) over the owned shards of the topics it looks
        at: what waits by the reach (_span) goes to the broker (a pull topic's at most
        broker.HELD_MAX). Every PASS_EVERY_MS (and at every step while it warms up) it looks
        at the topics with pointers in the window's buckets (one read: active_topics) and a
        turn of the others (_passed; every topic after a claim); in between only at the
        topics wake-ups named, new topics and those whose take failed. One round trip reads
        their write counts; a topic is read only where its counts moved, its position nears
        now + look-ahead, or its walk is new (from its durable cursors: a claimed slot, a new
        topic, a start), new walks first. Every CURSOR_STEP_MS it writes the cursors it may
        move."""
        now = self.services.clock()
        with self._named_lock:
            named, self._named = self._named, set()
        while self._again:  # appended by other threads; drained here, between two reads
            uid, shard, due = self._again.popleft()
            if (walk := self._walks.get(uid)) is not None:  # else a new walk from the cursor
                with walk.lock:  # a broker's read_now records its position when it ends
                    walk.read_again(shard, due)
            named.add(uid)
        try:
            self._step(now, named)
        except BaseException:
            with self._named_lock:  # read by the next step
                self._named |= named
            raise

    def _step(self, now: int, named: set[uuid.UUID]) -> None:
        horizon, reach, window = self._span(now)
        # while warming, other processes' wake-ups may not reach this releaser yet
        passing = (self._everyone or self._walking.warming()
                   or now - self._passed_at >= PASS_EVERY_MS)
        if passing:
            everyone, self._everyone, self._passed_at = self._everyone, False, now
            active = self.services.timeline.active_topics(window)
            unknown = active.difference(self._topics, self._asked)
            if unknown:  # a topic whose "topics" wake-up was lost: follow the changes once
                if len(self._asked) > MAX_ASKED:
                    self._asked.clear()
                self._asked |= unknown
                self._following.wake()
            candidates = list(self._topics.values()) if everyone else self._passed(active)
        else:  # between passes, only the topics written to (or handed back) since the last
            active = named
            candidates = [t for uid in named if (t := self._topics.get(uid)) is not None]
        owned = list(self._owned_shards(candidates))
        walks = self._walks_of(owned)
        # before any pointer is read, so a pointer written after them moves its count again
        counts = read_counts(self.services.timeline,
                             {t.uid: window for t, _ in owned if t.uid in active})
        reads = self._reads_of(owned, walks, active, counts, now, horizon, reach)
        futures = []
        # only on a pass (it looks at every topic), from the positions the last step left
        if passing and now - self._cursors_at >= CURSOR_STEP_MS:
            self._cursors_at = now
            futures = self._write_cursors([(t, walks[t.uid]) for t, _ in owned
                                           if t.uid in active], now)
        futures += [self._readers.submit(self._read_walk, topic, walk, starts, now, reach,
                                         window, found)
                    for topic, walk, starts, found in reads]
        all_done(futures)  # a failed read fails the step; the next one repeats it

    def _passed(self, active: set[uuid.UUID]) -> list[Topic]:
        """The topics a pass looks at: those active_topics listed, and the quiet ones whose
        turn it is (their uid modulo QUIET_TURNS, a turn that topics made or deleted do not
        shift), so each quiet topic's walk moves on within the window (Walk.passed_empty)
        and follows a change of its shards or mode every QUIET_TURNS passes, not at every
        one."""
        turn = self._turn % QUIET_TURNS
        self._turn += 1
        listed = [t for uid in active if (t := self._topics.get(uid)) is not None]
        return listed + [t for t in list(self._topics.values())
                         if t.uid.int % QUIET_TURNS == turn and t.uid not in active]

    def _reads_of(self, owned: list[tuple[Topic, dict[int, int]]], walks: dict[uuid.UUID, Walk],
                  active: set[uuid.UUID], counts: dict[uuid.UUID, Counts], now: int,
                  horizon: int, reach: int
                  ) -> list[tuple[Topic, Walk, dict[int, int], Counts]]:
        """The reads a walk step makes: (topic, walk, starts, counts), those it
        never read first (one made a moment ago may have a message due in 200 ms, and waited
        its turn among the hundred a retry storm keeps changing)."""
        safety_lag_ms = self.services.config.safety_lag_ms
        reads = []
        for topic, _ in owned:
            walk = walks[topic.uid]
            if topic.uid not in active and walk.passed_empty(now, reach, now - WINDOW_BACK_MS):
                continue
            if not topic.pushed and self.broker.room(topic.uid) <= 0:
                continue  # a backlog nobody takes: read on once the broker hands some out
            found = counts.get(topic.uid, {})
            starts = walk.starts(found, horizon, self._refill_ms, safety_lag_ms,
                                 self._closed_lanes(topic))
            if starts:
                reads.append((topic, walk, starts, found))
        reads.sort(key=lambda read: read[1].read_at is not None)
        return reads

    def read_now(self, topic: Topic, since_ms: int) -> None:
        """On a broker thread, before a round hands out: read the topic's owned shards at
        once, where its write counts moved (or its walk is new), unless a read of it began
        at or after since_ms (epoch ms), which saw every write before then. Counts that
        stand count as such a read (Walk.counts_stood)."""
        mine = dict(next(self._owned_shards([topic]), (topic, {}))[1])
        if not mine:
            return
        walk = self._walks_of([(topic, mine)])[topic.uid]
        if walk.read_at is not None and walk.read_at >= since_ms:
            return
        now = self.services.clock()
        horizon, reach, window = self._span(now)
        counts = read_counts(self.services.timeline, {topic.uid: window}).get(topic.uid, {})
        starts = walk.starts(counts, horizon, self._refill_ms, self.services.config.safety_lag_ms,
                             self._closed_lanes(topic))
        if not starts:
            with walk.lock:
                walk.counts_stood(now)
        elif self.broker.room(topic.uid) > 0:
            self._read_walk(topic, walk, starts, now, reach, window, counts)

    def _span(self, now: int) -> tuple[int, int, list[int]]:
        """(horizon, reach, window) of a walk step at `now` (epoch ms): a shard whose counts
        stand is read on once its position comes within the refill distance of the horizon
        (now + look-ahead); every read goes on to the reach (now + COUNTED_AHEAD_MS less the
        safety lag: any pointer written after the read began and due by then moves a count),
        so a quiet shard is read once every few ticks, not every one; the window's buckets
        are those from WINDOW_BACK_MS before now to the reach's."""
        cfg = self.services.config
        reach = now + COUNTED_AHEAD_MS - cfg.safety_lag_ms
        window = list(range(bucket_of(now - WINDOW_BACK_MS, cfg.bucket_ms),
                            bucket_of(reach, cfg.bucket_ms) + 1))
        return now + cfg.release_lookahead_ms, reach, window

    def _due_woken(self, topic_uid: uuid.UUID) -> None:
        """A due wake-up: the walk's next step reads the topic, and the broker's wants
        parked on it look again (a pull topic's)."""
        self.broker.woken(topic_uid)
        with self._named_lock:
            self._named.add(topic_uid)
        self._walking.wake()

    def _walk_everyone(self) -> None:
        """A bare due wake-up: the walk's next step looks at every topic."""
        self._everyone = True
        self._walking.wake()

    def _read_again(self, topic_uid: uuid.UUID, pointers: list[Pointer]) -> None:
        """On a broker or push thread: the walk reads these pointers again (it passed them,
        and they are not held: shards let go of, leases that will run out unposted)."""
        self._again.extend((topic_uid, p.shard, p.due_at_ms) for p in pointers)
        self._walking.wake()

    def _walks_of(self, owned: list[tuple[Topic, dict[int, int]]]) -> dict[uuid.UUID, Walk]:
        """The walk of each topic, new ones (a topic or owned shard it had none of) started at
        their durable cursors, read for all of them in one round trip."""
        new = [(topic, mine) for topic, mine in owned
               if (w := self._walks.get(topic.uid)) is None or w.shards != frozenset(mine)
               or w.pushed != topic.pushed]
        stored = self.services.timeline.cursors_of([t.uid for t, _ in new]) if new else {}
        for topic, mine in new:
            self._walks[topic.uid] = Walk.starting_at(
                self._starts(topic, mine, stored.get(topic.uid, {})), topic.pushed)
        return {topic.uid: self._walks[topic.uid] for topic, _ in owned}

    def _read_walk(self, topic: Topic, walk: Walk, starts: dict[int, int], began: int,
                   reach: int, window: list[int], counts: Counts) -> None:
        """Read the shards from `starts` to the reach: what waits there goes to the broker (a
        pull topic's at most its room). One read of a topic at a time: the walk's and the
        broker's (read_now) take turns."""
        with walk.lock:
            closed = self._closed_lanes(topic)
            want = PUSH_READ_MAX if topic.pushed else \
                max(1, min(self.broker.room(topic.uid), HELD_PER_LANE))
            result = self.services.scanner.upcoming(topic, starts, reach, want,
                                                    self.broker.holding(topic.uid), walk.lanes,
                                                    closed)
            self.broker.hold(topic, result.due)
            walk.record(began, starts, result.frontier_ms, reach, window, counts,
                        result.incomplete, result.lanes_ms, closed)

    def _closed_lanes(self, topic: Topic) -> frozenset[tuple[int, int]]:
        """The (shard, lane)s of a pull topic the walk does not read now: the broker holds
        enough of them (workers.broker.HELD_PER_LANE)."""
        return frozenset() if topic.pushed else self.broker.full_lanes(topic.uid)

    def _write_cursors(self, walked: list[tuple[Topic, Walk]], now: int) -> list[Future[Any]]:
        """Write the durable cursors of these topics' walks that may move CURSOR_STEP_MS or
        more (workers.walk.Walk.cursor_moves), on the readers."""
        held = self._held()
        safety_lag_ms = self.services.config.safety_lag_ms
        return [self._readers.submit(self.services.scanner.advance, topic, moves)
                for topic, walk in walked
                if (moves := walk.cursor_moves(now, safety_lag_ms, held.get(topic.uid, {}),
                                               CURSOR_STEP_MS))]

    def _held(self) -> dict[uuid.UUID, dict[int, int]]:
        """{topic: {shard: the earliest due time (epoch ms) of a message it holds}}: the
        broker's held messages, and the pointers handed back since the walk's step drained
        them (no longer held, their position not yet moved back)."""
        held: dict[uuid.UUID, dict[int, int]] = {}
        pending = [*self._again, *self.broker.held_pointers(), *self.push.unwritten_pointers()]
        for uid, shard, due in pending:
            of_topic = held.setdefault(uid, {})
            of_topic[shard] = min(of_topic.get(shard, due), due)
        return held

    def _forget_gone(self) -> None:
        """Drop what the steps recorded of topics no longer known. follow_topics drops a
        deleted topic's records, but a walk step under way then may put one back, which
        would stay: with topics made and deleted all day, they add up. Run by the
        follow_topics steps of the FORGET_AFTER_GONE_S after a deletion (a pass over every record:
        about 4 ms for 30,000)."""
        for uid in list(self._walks):  # a copy: the walk's threads add meanwhile
            if uid not in self._topics:
                self._walks.pop(uid, None)
        for uid in list(self.broker.held):
            if uid not in self._topics:
                self.broker.forget(uid)

    def _starts(self, topic: Topic, mine: dict[int, int], stored: dict[int, int]
                ) -> dict[int, int]:
        """{owned shard: where a new walk reads it from}: its stored cursor, else the safety
        lag before the topic was created."""
        default = topic.created_at_ms - self.services.config.safety_lag_ms
        return {s: stored.get(s, default) for s in mine}

    def stop(self) -> None:
        """Graceful stop: no new work, finish in-flight POSTs, give the slots back at once.
        The last log line gives each phase's seconds: a slow rolling restart shows which
        one held it (in-flight POSTs wait up to their topic's timeout_seconds). A second
        call returns at once."""
        if self._stopping.is_set():
            return
        log.info("releaser %s stopping", self.member)
        began = last = time.monotonic()
        phases: list[str] = []

        def phase_done(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            phases.append(f"{name} {now - last:.2f}")
            last = now

        self._stopping.set()
        with _running_lock:
            _running.discard(self)
        self.broker.stop()
        # no new job starts; the runs under way end at their next check of _stopping
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        self._readers.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + STOP_RUNS_S

        def left_s() -> float:
            return max(0.0, deadline - time.monotonic())

        for step in self.paced:
            step.stop(left_s())
        self.wakes.close()
        self._await_runs(left_s())
        self.schedules.stop()
        phase_done("steps")
        self.push.stop()
        phase_done("posts")
        try:
            self.ownership.release_all()
        except StoreUnavailable as exc:  # the slots' leases run out instead
            log.warning("releaser %s could not hand its slots back: %s", self.member, exc.detail)
        with contextlib.suppress(StoreUnavailable):  # else its report leaves by TTL in 60 s
            self.services.clocks.forget(self.member)
        phase_done("slots")
        log.info("releaser %s stopped in %.2f s (%s)", self.member, time.monotonic() - began,
                 ", ".join(phases))


def run_forever(services: Services, member: str | None = None) -> None:
    """Start a releaser and run until SIGTERM or SIGINT, then stop gracefully."""
    metrics.time_collections()
    releaser = Releaser(services, member)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve_metrics(releaser)
    releaser.start()
    # what the process made up to here (modules, the driver, the releaser's parts) lives
    # as long as it does: kept out of every later collection, which then walks only what
    # came since (docs/design.md, "The releaser's memory")
    gc.freeze()
    stopping.wait()
    releaser.stop()


def serve_metrics(releaser: Releaser) -> None:
    """Serve this releaser's Prometheus metrics on DUETIME_RELEASER_METRICS_PORT (0: not at
    all); a port already taken (a second releaser on the host) is logged, not fatal."""
    cfg = releaser.services.config
    metrics.SLOTS_OWNED.set_function(lambda: len(releaser.ownership.owned()))
    metrics.TIMERS_ARMED.set_function(lambda: releaser.push.stats()["armed"])
    if not cfg.releaser_metrics_port:
        return
    try:
        start_http_server(cfg.releaser_metrics_port, addr=cfg.http_host)
    except OSError as exc:
        log.warning("releaser metrics not served on %s:%d: %s", cfg.http_host,
                    cfg.releaser_metrics_port, exc)
        return
    log.info("releaser metrics on http://%s:%d/metrics", cfg.http_host,
             cfg.releaser_metrics_port)
