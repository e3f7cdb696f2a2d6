"""`duetime releaser`: walks the owned shards of the timeline and releases due messages.

Its steps are idempotent. Four run on threads of their own at two paces (workers/paced.py):
soon after a wake-up (app.delivery.wakeups: a datagram another process sends after a write the step
must see) and otherwise every idle period, a safety net that costs a few reads a second for
the whole releaser. The others are periodic jobs (APScheduler). Without a wake-up, steps and
jobs run on the releaser's beat (workers/beat.py: the epoch multiples of lease/3, the
ownership tick), an idle period up to one beat early, so an idle releaser's reads reach
Cassandra at a few shared instants; each costs the node about 5 ms of CPU however few
requests it holds.
- ownership (every lease/3): heartbeat, renew, rebalance release slots (workers/ownership.py);
- topics (woken by "topics": FOLLOW_EVERY_MS; idle: IDLE_EVERY_MS): the changes of topics
  other processes wrote, and every topic_refresh_ms the whole list, so new topics start at
  once and deleted ones stop;
- look-ahead (woken by "due": release_rescan_ms; idle: release_idle_ms): for owned shards
  of webhook topics, pointers due from RECENT_MS before the last run began (or before now)
  to now + lookahead go into the timer heap, so a message scheduled a moment ahead, or one
  that came due while a long run was under way, is still released on time. Only topics
  listed in active_topics for the window's buckets are polled, and of those only the ones
  whose write counts (bucket_writes) moved since it last read them, or read whole more than
  1.5 s ago (app.delivery.scan.ReadAhead); all counts are read in one round trip
  (workers/count_reads.py), so frequent re-scans stay cheap;
- sweep (release_sweep_ms while any topic is awake or "due" woke it; else IDLE_EVERY_MS):
  move stragglers (pointers written behind a cursor, found by
  their partition's write count) to now; from each owned shard's stored cursor, put what the
  look-ahead missed into the heap, then move the cursor forward. For pull topics the sweep
  only keeps cursors moving, so consumers' lease scans stay short. A quiet topic (cursors
  caught up, no pointer near now) is skipped without a read until a pointer of it comes near
  now (active_topics) or a process writes pointers of it (topic_writes, which a pointer
  written behind its cursors also records), or up to five minutes have passed: two reads a
  sweep for all topics. Awake topics are swept SWEEPERS at a time, and a sweep rests at
  least as long as it ran (a crowded keyspace's sweeps take seconds of the releaser's one
  interpreter, which the look-ahead needs too);
- schedules (SCHEDULES_EVERY_MS): produce the fires of the schedules of the owned slots
  (workers/schedules.py; their listings are read again when "schedules" wakes it);
- operations (woken by "operations": OPERATIONS_EVERY_MS; idle: IDLE_EVERY_MS): run pending
  campaign operations (workers/operations.py);
- clock (CLOCK_EVERY_MS): this clock against Cassandra's and against the other releasers'
  (app.ops.clock_skew), gauges and a warning past half the safety lag.
A dispatcher thread pops the heap the prepare lead before each due time and hands messages to
PushDispatcher, which leases them and POSTs each at its due time (workers/push.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import start_http_server

from app.config import Config
from app.core.timeline import WRITE_WINDOW_MS, bucket_of, release_slot_of, stable_hash
from app.delivery import wakeups
from app.delivery.leasing import passed_over
from app.delivery.scan import ReadAhead
from app.errors import StoreUnavailable
from app.messages.transitions import replace_ahead
from app.models import Topic
from app.ops import clock_skew, metrics
from app.services import Services
from app.store.ownership import OwnershipStore
from workers.beat import Beat
from workers.broker import Broker
from workers.catch_up import Behind, reach_ms, with_stragglers
from workers.count_reads import Counts, ReadBefore, changed_topics
from workers.operations import OperationRunner
from workers.ownership import RENEW_FRACTION, SlotOwnership
from workers.paced import PacedStep
from workers.push import PushDispatcher
from workers.quiet_recheck import QuietTopic, still_quiet
from workers.schedules import ScheduleRunner
from workers.timers import MAX_WAIT_S, Timer, TimerHeap, earliest_by_shard
from workers.topics import FOLLOW_EVERY_MS, KnownTopics
from workers.wake_listener import WakeListener

RECENT_MS = 250  # pointers written this far behind now are still caught by the look-ahead
# the look-ahead reads back to where its last run began, at most this far (else: the sweep)
MAX_LOOK_BACK_MS = 60_000
LOOK_AHEAD_READERS = 8
SWEEPERS = 4
SWEEP_REST_SHARE = 1.0
MAX_TIMERS_PER_SCAN = 20_000
MAX_SEEN = 10_000
PULL_SWEEP_WANT = 25
REPORT_EVERY_MS = 10_000
CLOCK_EVERY_MS = 10_000
# A sweep writes a cursor only when it moves this far: an idle topic costs a write per shard
# every 5 s, not every second, and scans re-read at most this much of spent timeline.
CURSOR_STEP_MS = 5000
CATCH_UP_EVERY_MS = 5000  # stragglers are already late; their search costs a read per topic
# Consumers' lease calls move a pull topic's cursors themselves; the sweep only moves those
# left behind (nobody polled, or everything was cancelled), at most this often per topic: a
# scan that finds a backlog nobody consumes cannot move its cursor, and repeating it every
# sweep cost a fifth of a core with a score of drained or idle topics.
PULL_KEEP_EVERY_MS = 10_000
PREPARE_EVERY_MS = 100
IDLE_DISPATCH_WAIT_S = 5.0
OPERATIONS_EVERY_MS = 1000
SCHEDULES_EVERY_MS = 500
# Without a wake-up, topics, sweep (when every topic is quiet) and operations run this often.
IDLE_EVERY_MS = 5000
# A new releaser polls at the busy paces until every process has read its wake address.
WARM_MS = 2 * wakeups.ADDRESSES_EVERY_MS
MAX_ASKED = 10_000
UNAVAILABLE_WARN_EVERY_S = 10
# A quiet topic is re-checked at least this often (a safety net: workers.quiet_recheck), each
# at its own moment within the period, so 10,000 topics found quiet together are not re-checked
# together; those that came due are checked in one go every tenth of the period.
QUIET_RECHECK_MS = 300_000
# A topic written to (topic_writes) is swept for this long after, by the writer's clock: a
# catch-up runs several times meanwhile, and a writer's clock may be this far behind.
WRITTEN_REACH_MS = 60_000
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
                             lambda uid: self._following.wake())
        self.wakes = bind_listeners(cfg, self.broker)
        # the ownership tick's period: every idle poll of this releaser falls on its instants
        self.beat = Beat(cfg.release_lease_ms / RENEW_FRACTION)
        self.ownership = SlotOwnership(OwnershipStore(services.db, cfg.release_ring), self.member,
                                       cfg.release_slots, cfg.release_lease_ms, services.clock,
                                       self.wakes.address, broker_token, self._gained_slots,
                                       self._gave_back_slots)
        self.timers: TimerHeap[Timer] = TimerHeap(services.clock)
        self._unavailable_warned: dict[str, float] = {}  # step -> when last warned
        self._seen: dict[uuid.UUID, tuple[frozenset[int], ReadAhead]] = {}
        self._looked_from: int | None = None  # when the last look-ahead run that ended began
        self._claims = 0  # slots claimed so far (written by the ownership tick alone)
        self._claims_read = 0  # of those, how many a look-ahead run that ended began after
        # a look-ahead record stands this long (app.delivery.scan.ReadAhead): half what the window
        # leaves after an idle period, so a whole read comes at least as long before a
        # pointer it alone can find is due (1.5 s of 5, with the defaults)
        self._reread_ms = max(cfg.release_rescan_ms,
                              (cfg.release_lookahead_ms - cfg.release_idle_ms) // 2)
        # the look-ahead reads its changed topics this many at a time: one after another,
        # 130 topics written to between runs made each run take seconds of round trips
        self._readers = ThreadPoolExecutor(LOOK_AHEAD_READERS, thread_name_prefix="look-ahead")
        self._sweepers = ThreadPoolExecutor(SWEEPERS, thread_name_prefix="sweep")
        self._behind: dict[uuid.UUID, tuple[frozenset[int], dict[tuple[int, int], int]]] = {}
        self._last_catch_up = 0
        self._pull_kept: dict[uuid.UUID, int] = {}  # topic -> when its cursors were last kept
        # topic -> (when a sweep last found it quiet, its lowest owned cursor then)
        self._quiet: dict[uuid.UUID, tuple[int, int]] = {}
        self._last_recheck = 0
        self._last_gone = -math.inf  # when follow_topics last saw a topic deleted (monotonic s)
        self._swept_slots: frozenset[int] = frozenset()  # the slots _quiet was judged on
        self._slot_maps: dict[tuple[uuid.UUID, int], dict[int, int]] = {}
        self._asked: set[uuid.UUID] = set()  # active topics not known: followed once each
        self.push = PushDispatcher(services, self.member, self.timers, self._topics.get,
                                   self.ownership.may_prepare)
        self._stop = threading.Event()
        self._stopping = threading.Event()  # set first: long steps end at their next check
        self.operations = OperationRunner(services, self.member, self._stopping.is_set)
        self.schedules = ScheduleRunner(services, self.ownership.owned, self._topics.get,
                                        self.beat)
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="dispatcher",
                                            daemon=True)
        # the threads running a step or job now (_safely), waited for by stop()
        self._runs: Counter[threading.Thread] = Counter()
        self._runs_changed = threading.Condition()
        self.scheduler = BackgroundScheduler(job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._following = PacedStep("topics", self.follow_topics, FOLLOW_EVERY_MS,
                                    IDLE_EVERY_MS, self._safely, WARM_MS, self.beat)
        self._looking = PacedStep("look-ahead", self.look_ahead, cfg.release_rescan_ms,
                                  cfg.release_idle_ms, self._safely, WARM_MS, self.beat)
        self._sweeping = PacedStep("sweep", self.sweep, cfg.release_sweep_ms, IDLE_EVERY_MS,
                                   self._safely, WARM_MS, self.beat, SWEEP_REST_SHARE)
        self._operating = PacedStep("operations", self.run_operations, OPERATIONS_EVERY_MS,
                                    IDLE_EVERY_MS, self._safely, WARM_MS, self.beat)
        self.paced = [self._following, self._looking, self._sweeping, self._operating]
        self.wakes.on("topics", self._following.wake)
        self.wakes.on("due", self._looking.wake)
        self.wakes.on("due", self._sweeping.wake)
        self.wakes.on("schedules", self.schedules.wake)
        self.wakes.on("operations", self._operating.wake)
        self.wakes.on("slots", self._claim_share_now)
        self.wakes.on_pull(self.broker.woken)  # a write of a pull topic due soon

    def start(self) -> None:
        cfg = self.services.config
        with _running_lock:
            _running.add(self)
        # the broker listens before the first tick publishes its address: an API process
        # that reads it then and finds the port closed would not try again for a while
        self.wakes.start()
        self.broker.start()
        self._safely(self.ownership.tick)
        self._safely(self.follow_topics)
        jobs = [(self.ownership.tick, cfg.release_lease_ms / RENEW_FRACTION),
                (self.report, REPORT_EVERY_MS),
                (self.produce_fires, SCHEDULES_EVERY_MS),
                (self.check_clock, CLOCK_EVERY_MS)]
        for job, every_ms in jobs:
            self.scheduler.add_job(self._safely, self.beat.trigger(every_ms), args=[job],
                                   id=job.__name__)
        self.scheduler.start()
        for step in self.paced:
            step.start()
        self._dispatcher.start()
        log.info("releaser %s started", self.member)

    def _safely(self, job: Callable[[], bool | None]) -> bool | None:
        """Log and continue: one failing step never stops the releaser. Cassandra being
        unreachable is one warning line per step every UNAVAILABLE_WARN_EVERY_S, not a
        traceback every run (the look-ahead runs 20 times a second)."""
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
        log.info("releaser %s slots=%d timers=%d waiting=%d %s", self.member,
                 len(self.ownership.owned()), len(self.timers), self.timers.waiting(),
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
        operations and schedules are this releaser's now, so every step looks at once, and
        the next look-ahead run reaches back over the hand-over (_handover_reach_ms)."""
        self._claims += 1
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
        by _safely, as for every step. New topics wake the look-ahead and the sweep: a
        message of a topic created a moment ago may already be due."""
        before = set(self._topics)
        gone = self._known.step()
        if gone:
            self._last_gone = time.monotonic()
        for uid in gone:  # what the steps recorded of a deleted topic
            for records in self._per_topic_records():
                records.pop(uid, None)
        if any(uid not in before for uid in self._topics):
            self._looking.wake()
            self._sweeping.wake()

    def _owned_shards(self, topics: Iterable[Topic] | None = None
                      ) -> Iterator[tuple[Topic, dict[int, int]]]:
        """(topic, {shard: release slot}) for every topic (of `topics`, else all) with a
        shard this releaser owns. A topic's slots are computed once per shard count: with
        10,000 topics, hashing every shard on every 50 ms look-ahead cost most of a core."""
        owned = self.ownership.owned()
        for topic in list(self._topics.values()) if topics is None else topics:
            mine = {s: slot for s, slot in self._slots_of(topic).items() if slot in owned}
            if mine:
                yield topic, mine

    def _shards_owned(self, topic: Topic) -> set[int]:
        """The topic's shards whose release slot this releaser holds now."""
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

    def look_ahead(self) -> None:
        now = self.services.clock()
        horizon = now + self.services.config.release_lookahead_ms
        bucket_ms = self.services.config.bucket_ms
        # from where the last run that ended began: what came due while it ran (it may take
        # seconds in a crowded keyspace) is read now, not left to the sweep
        since = max(min(now, self._looked_from or now), now - MAX_LOOK_BACK_MS) - RECENT_MS
        claims = self._claims
        if claims != self._claims_read:  # what a claimed slot's last owner held came due
            since = min(since, now - self._handover_reach_ms())
        buckets = range(bucket_of(since, bucket_ms), bucket_of(horizon, bucket_ms) + 1)
        # one read for all topics: only those with pointers in the window are polled
        active = self.services.timeline.active_topics(buckets)
        unknown = active.difference(self._topics, self._asked)
        if unknown:  # a topic whose "topics" wake-up was lost: follow the changes once
            if len(self._asked) > MAX_ASKED:
                self._asked.clear()
            self._asked |= unknown
            self._following.wake()
        webhook = [t for uid in active if (t := self._topics.get(uid)) is not None and t.pushed]
        owned = list(self._owned_shards(webhook))
        befores = [self._read_before(t, mine, now) for t, mine in owned]
        # one round trip, then only those written to are read
        changed = changed_topics(self.services.timeline, befores, buckets)
        to_read = [(topic, mine, before)
                   for (topic, mine), before in zip(owned, befores, strict=True)
                   if topic.uid in changed]
        # topics it never read first: one made a moment ago may have a message due in 200 ms,
        # and waited its turn among the hundred a retry storm keeps changing
        to_read.sort(key=lambda read: read[0].uid in self._seen)
        reads = [self._readers.submit(self._into_heap, topic, mine, dict.fromkeys(mine, since),
                                      horizon, before.seen or self._new_record(before, now),
                                      changed[topic.uid])
                 for topic, mine, before in to_read]
        # a failed read fails the run (the next one repeats it), once every read has ended:
        # one read of a topic at a time
        all_done(reads)
        self._looked_from = now
        self._claims_read = claims  # a run that failed leaves the next to read back

    def _handover_reach_ms(self) -> int:
        """How far back (ms) the look-ahead run after a slot is claimed reads: a releaser
        that gives a slot back (rebalance, stop) drops the timers it held for it (after a
        tick's grace, workers.ownership.may_prepare, on a rebalance), and the
        claim comes moments later (the "slots" wake-up) or, the datagram lost, at the next
        ownership tick (a third of a lease); one that dies holds the slot until its lease
        runs out. Messages that came due in that gap were left to the sweep, which in a
        crowded keyspace came seconds later (python -m tests.bench.crowded with two
        releasers: 6 s late). The look-ahead's span (5 s by default) covers the tick with
        room to spare."""
        cfg = self.services.config
        return cfg.release_lease_ms + cfg.release_lookahead_ms

    def _read_before(self, topic: Topic, mine: dict[int, int], now: int) -> ReadBefore:
        """What the look-ahead recorded of a topic (workers.count_reads): nothing when its
        shards changed or the record is no longer fresh (app.delivery.scan.ReadAhead)."""
        shards = frozenset(mine)
        owned, seen = self._seen.get(topic.uid, (frozenset(), None))
        if seen is None or owned != shards or not seen.fresh(now, self._reread_ms) \
                or len(seen.cells) > MAX_SEEN:
            seen = None
        return ReadBefore(topic.uid, shards, seen)

    def _new_record(self, before: ReadBefore, now: int) -> ReadAhead:
        """A new look-ahead record of a topic, in place of the one it had."""
        seen = ReadAhead(now)
        self._seen[before.uid] = (before.shards, seen)
        return seen

    def _into_heap(self, topic: Topic, mine: dict[int, int], starts: dict[int, int],
                   horizon: int, seen: ReadAhead | None = None,
                   counts: dict[tuple[int, int], int] | None = None) -> dict[int, int]:
        result = self.services.scanner.upcoming(topic, starts, horizon, MAX_TIMERS_PER_SCAN // 4,
                                                self.timers.holds, seen, counts)
        self.timers.add([Timer(topic.uid, mine[d.pointer.shard], d) for d in result.due])
        return result.frontier_ms

    def sweep(self) -> bool:
        """One sweep; busy (the next at release_sweep_ms, or after a rest as long as it
        ran) while any owned topic is awake."""
        now = self.services.clock()
        catching_up = now - self._last_catch_up >= CATCH_UP_EVERY_MS
        if catching_up:
            self._last_catch_up = now
        owned = self.ownership.owned()
        if owned != self._swept_slots:  # quiet was judged on other shards' cursors
            self._swept_slots = owned
            self._quiet.clear()
        recent = self._recent_topics(now)
        topics = list(self._topics.values())
        rechecked: set[uuid.UUID] = set()
        if now - self._last_recheck >= QUIET_RECHECK_MS // 10:  # those due since, together
            rechecked = {t.uid for t in topics if t.uid not in recent
                         and now - self._quiet.get(t.uid, (now, 0))[0] >= QUIET_RECHECK_MS}
            try:
                still = self._recheck_quiet([t for t in topics if t.uid in rechecked], now)
            except StoreUnavailable as exc:  # the awake topics are swept all the same
                log.warning("quiet re-check failed, tried again at the next sweep: %s",
                            exc.detail)
                rechecked = set()  # quiet still, until then
            else:
                self._last_recheck = now
                for uid in still:
                    self._quiet[uid] = (now, self._quiet[uid][1])
                rechecked -= still
        awake = [t for t in topics if t.uid in recent or t.uid in rechecked
                 or t.uid not in self._quiet]
        owned_awake = list(self._owned_shards(awake))  # quiet ones skipped before any work
        # one round trip for every topic's cursors: a crowded keyspace made it one a topic
        stored_of = self.services.timeline.cursors_of([t.uid for t, _ in owned_awake])
        plans = [(topic, mine, stored_of.get(topic.uid, {})) for topic, mine in owned_awake]
        starts_of = {topic.uid: self._starts(topic, mine, stored) for topic, mine, stored in plans}
        # a re-check may have seen a straggler
        due = [(topic, mine, starts_of[topic.uid]) for topic, mine, _ in plans
               if catching_up or topic.uid in rechecked]
        straggling: dict[uuid.UUID, Counts | None]  # None: its catch-up reads its own counts
        try:
            straggling = dict(self._with_stragglers(due))
        except StoreUnavailable as exc:  # each one's own reads, as if all had moved
            log.warning("catch-up's reads together failed, each topic reads alone: %s",
                        exc.detail)
            straggling = dict.fromkeys(topic.uid for topic, _, _ in due)
        # topics are swept SWEEPERS at a time: one after another, a crowded keyspace (a few
        # hundred awake topics) made a sweep take 15-40 s of round trips, and what only the
        # sweep finds (stragglers, lost count bumps) waited that long
        work = [self._sweepers.submit(self._sweep_topic, topic, mine, starts_of[topic.uid],
                                      stored, now, topic.uid in recent,
                                      topic.uid in straggling, straggling.get(topic.uid))
                for topic, mine, stored in plans]
        try:
            all_done(work)  # every topic swept before a failure ends the step
        finally:
            if time.monotonic() - self._last_gone < FORGET_AFTER_GONE_S:
                self._forget_gone()
        return bool(owned_awake)

    def _per_topic_records(self) -> tuple[dict[uuid.UUID, Any], ...]:
        """What the steps record of each topic, keyed by its uid: a deleted topic's go."""
        return (self._pull_kept, self._quiet, self._seen, self._behind)

    def _forget_gone(self) -> None:
        """Drop what the steps recorded of topics no longer known. follow_topics drops a
        deleted topic's records, but a look-ahead or sweep run under way then may put one
        back, which would stay: with topics made and deleted all day, they add up. Run by
        the sweeps of the FORGET_AFTER_GONE_S after a deletion (a pass over every record:
        about 4 ms for 30,000)."""
        for records in self._per_topic_records():
            for uid in list(records):  # a copy: the look-ahead's threads add meanwhile
                if uid not in self._topics:
                    records.pop(uid, None)

    def _starts(self, topic: Topic, mine: dict[int, int], stored: dict[int, int]
                ) -> dict[int, int]:
        """{owned shard: where the sweep reads it from}: its stored cursor, else the safety
        lag before the topic was created."""
        default = topic.created_at_ms - self.services.config.safety_lag_ms
        return {s: stored.get(s, default) for s in mine}

    def _with_stragglers(self, topics: list[tuple[Topic, dict[int, int], dict[int, int]]]
                         ) -> dict[uuid.UUID, Counts]:
        """Of (topic, owned shards, cursors) due a catch-up, those whose catch-up must read
        partitions, with their write counts behind the cursors (workers.catch_up), the
        indexes of all read together."""
        behind = []
        for topic, mine, cursors in topics:
            seen = self._caught_up_counts(topic.uid, frozenset(mine))
            if seen is None:  # a record of these shards, which the re-check needs
                seen = {}
                self._behind[topic.uid] = (frozenset(mine), seen)
            behind.append(Behind(topic.uid, cursors, seen))
        cfg = self.services.config
        return with_stragglers(self.services.timeline, behind, cfg.bucket_ms,
                               cfg.release_catchup_ms)

    def _sweep_topic(self, topic: Topic, mine: dict[int, int], starts: dict[int, int],
                     stored: dict[int, int], now: int, recent: bool, catch_up: bool,
                     counts: Counts | None) -> None:
        """One topic's share of a sweep, from `starts` (its cursors as stored, else where it
        began): the catch-up when asked (from `counts` when read already), then its cursors
        kept (pull) or its pointers put into the heap and its cursors moved (webhook), then
        whether it is quiet. Runs beside other topics' shares: it touches only this topic's
        entries of the releaser's records."""
        failed = None
        if catch_up:
            try:
                self._catch_up(topic, starts, now, counts)
            except StoreUnavailable as exc:  # its cursors are swept all the same: a
                failed = exc  # straggler's count stays unrecorded, so the next one reads it
        if not topic.pushed:
            safety_lag_ms = self.services.config.safety_lag_ms
            behind = {s for s, start in starts.items()
                      if start < now - safety_lag_ms - CURSOR_STEP_MS}
            moves = self._keep_pull_cursors(topic, behind, stored, now)
        else:
            moves = self._sweep_webhook(topic, mine, starts, now)
        self._note_quiet(topic, {s: moves.get(s, start) for s, start in starts.items()},
                         recent, now)
        if failed is not None:
            raise failed

    def _caught_up_counts(self, topic_uid: uuid.UUID, shards: frozenset[int]) -> Counts | None:
        """The write counts the catch-up last recorded of a topic ({(bucket, shard): n}, the
        record itself), or None when it has no record for these owned shards."""
        owned, seen = self._behind.get(topic_uid, (frozenset(), {}))
        return seen if owned == shards else None

    def _recheck_quiet(self, topics: list[Topic], now: int) -> set[uuid.UUID]:
        """Of quiet topics due for their re-check, those still quiet, checked together
        (workers.quiet_recheck); the rest are swept in full."""
        if not topics:
            return set()
        cfg = self.services.config
        checked = []
        for topic, mine in self._owned_shards(topics):
            shards = frozenset(mine)
            seen = self._caught_up_counts(topic.uid, shards)
            if seen is not None:  # else swept in full: its catch-up records them
                checked.append(QuietTopic(topic.uid, self._quiet[topic.uid][1], shards, seen))
        return still_quiet(self.services.timeline, checked, now, cfg.bucket_ms,
                           cfg.release_catchup_ms, cfg.release_lookahead_ms)

    def _recent_topics(self, now: int) -> set[uuid.UUID]:
        """Topics a sweep must look at even if found quiet before (two reads for all topics):
        those with pointers near now (from where caught-up cursors may lag to the
        look-ahead's end), and those written to in the last WRITTEN_REACH_MS (the write
        may be a pointer behind their cursors, which only the catch-up finds)."""
        cfg = self.services.config
        near = self.services.timeline.active_topics(range(
            bucket_of(now - cfg.safety_lag_ms - 2 * CURSOR_STEP_MS, cfg.bucket_ms),
            bucket_of(now + cfg.release_lookahead_ms, cfg.bucket_ms) + 1))
        written = self.services.timeline.written_topics(range(
            (now - WRITTEN_REACH_MS) // WRITE_WINDOW_MS,
            (now + WRITE_WINDOW_MS) // WRITE_WINDOW_MS + 1))
        return near | written

    def _sweep_webhook(self, topic: Topic, mine: dict[int, int], starts: dict[int, int],
                       now: int) -> dict[int, int]:
        """From each owned shard's cursor, put what the look-ahead missed into the heap,
        then move the cursors forward; returns the moves."""
        cfg = self.services.config
        frontier = self._into_heap(topic, mine, starts, now + cfg.release_lookahead_ms)
        earliest = earliest_by_shard(self.timers.items(), topic.uid)
        moves = {}
        for s, start in starts.items():
            through = min(frontier[s], now - cfg.safety_lag_ms, earliest.get(s, frontier[s]))
            if through >= start + CURSOR_STEP_MS:
                moves[s] = through
        self.services.scanner.advance(topic, moves)
        return moves

    def _note_quiet(self, topic: Topic, cursors: dict[int, int], active: bool,
                    now: int) -> None:
        """A topic is quiet when it is not among the sweep's recent topics (no pointer near
        now, no write in the last WRITTEN_REACH_MS) and every owned cursor is caught up:
        nothing can be due, behind or waiting, so later sweeps skip it (no read) until it is
        recent again, or (spread over the topics) a half to a whole QUIET_RECHECK_MS
        passes: then it is re-checked with many others (_recheck_quiet), and swept only if a
        pointer reached it."""
        caught_up = all(c >= now - self.services.config.safety_lag_ms - 2 * CURSOR_STEP_MS
                        for c in cursors.values())
        if caught_up and not active:
            self._quiet[topic.uid] = (
                now - stable_hash(str(topic.uid)) % (QUIET_RECHECK_MS // 2), min(cursors.values()))
        else:
            self._quiet.pop(topic.uid, None)

    def _catch_up(self, topic: Topic, cursors: dict[int, int], now: int,
                  counts: Counts | None = None) -> None:
        """Move stragglers (pointers written behind the cursor) to now, where every reader
        finds them (rule 2's trap: docs/design.md); `counts`: the topic's write counts
        behind its cursors, when read already."""
        # recorded for these shards by _with_stragglers; none if the topic was just deleted
        seen = self._caught_up_counts(topic.uid, frozenset(cursors))
        if seen is None:
            seen = {}
        since = reach_ms(cursors, self.services.config.release_catchup_ms)
        found = self.services.scanner.stragglers(topic, cursors, since, seen, now, counts)
        done: set[str] = set()
        try:
            paused = passed_over(self.services, topic, found)  # resuming brings those back
            found = [d for d in found if d.row.id not in paused]
            if found:
                moved = replace_ahead(self.services, topic, [d.row for d in found], now)
                done = {r.id for r in moved}
                self.services.scanner.spend(topic, [d.pointer for d in found
                                                    if d.row.id in done])
                log.info("moved %d messages of topic %s found behind the cursor", len(moved),
                         topic.name)
        finally:  # not moved (failed, changed meanwhile, or a write failed): read it again
            for d in found:
                if d.row.id not in done:
                    seen.pop((bucket_of(d.pointer.due_at_ms, self.services.config.bucket_ms),
                              d.pointer.shard), None)

    def _keep_pull_cursors(self, topic: Topic, behind: set[int], stored: dict[int, int],
                           now: int) -> dict[int, int]:
        """Move the pull cursors of shards left behind (as the sweep read them) over spent
        pointers, stopping at the first live ones; at most every PULL_KEEP_EVERY_MS per
        topic, so a backlog nobody consumes costs a few reads per interval. Returns the
        moves."""
        if not behind or now < self._pull_kept.get(topic.uid, 0) + PULL_KEEP_EVERY_MS:
            return {}
        self._pull_kept[topic.uid] = now
        result = self.services.scanner.scan(topic, now, PULL_SWEEP_WANT, behind, stored)
        moves = {s: ms for s, ms in result.moves(result.due).items()
                 if ms >= result.cursors_ms[s] + CURSOR_STEP_MS}
        self.services.scanner.advance(topic, moves)
        return moves

    def _dispatch_loop(self) -> None:
        """Every PREPARE_EVERY_MS, hand what is due within the lead (plus that period) to the
        push dispatcher: one take per topic and period instead of one per message, which
        at hundreds of messages a second spent the releaser's interpreter on round trips.
        With no timer and nothing waiting for room it waits up to IDLE_DISPATCH_WAIT_S: a
        timer added or room freed wakes it (TimerHeap's condition)."""
        while not self._stop.is_set():
            began = time.monotonic()
            idle = not self.timers.waiting() and not self.push.has_waiting()
            try:
                self.push.submit(self.timers.pop_due(
                    self.push.lead_ms() + PREPARE_EVERY_MS,
                    max_wait_s=IDLE_DISPATCH_WAIT_S if idle else MAX_WAIT_S))
            except Exception:  # log and continue
                log.exception("dispatch failed")
            if not self._stop.is_set():
                self.timers.rest(PREPARE_EVERY_MS / 1000 - (time.monotonic() - began),
                                 self.push.lead_ms())

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
        for executor in (self._readers, self._sweepers):
            executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + STOP_RUNS_S

        def left_s() -> float:
            return max(0.0, deadline - time.monotonic())

        for step in self.paced:
            step.stop(left_s())
        self.wakes.close()
        self._await_runs(left_s())
        self.schedules.stop()
        phase_done("steps")
        self._stop.set()
        self.timers.wake()
        self._dispatcher.join(left_s())
        phase_done("dispatcher")
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
    releaser = Releaser(services, member)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve_metrics(releaser)
    releaser.start()
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
