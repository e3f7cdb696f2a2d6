"""Lease calls of one process on one topic are served together: one pass at a time.

Every waiting call (a long poll, or a call with wait_ms 0) joins its topic's queue. Whenever
no pass over the topic is running and one is needed, one of the waiting calls starts it, on
a thread of its own, for the queue's head (first come, first served, up to PASS_MAX messages
in all), and it hands each call its share. A pass is needed at once when a call is waiting
that no pass started after its arrival has served yet, and otherwise every interval while
calls wait.

A process that holds messages leased ahead for waiting calls (app.pull_ahead) says when the
next one comes due (wake_at); at that moment a waiting thread runs a hand-out (no read of the
timeline, no host lock), even while a pass is running, so the message goes out at its due
moment rather than when the pass ends or at the next interval.

A pass that found nothing may let its topic rest (rest): no interval pass until a given
moment (the earliest pointer it saw ahead, or an idle period), unless a wake-up (wake)
says a pointer was written meanwhile. A wake-up that comes while a pass is running makes
that pass's rest void, since its read may have missed the write (wakes).

So each pass reads every shard (that can have changed: app.quiet_marks) once for all the
calls it serves, in one round, instead of each call racing the others of its process over
shards and homes; idle consumers cost one
pass per topic and interval in each process, not one per consumer, and on a resting topic
one per idle period; and a call is never answered before a pass that started after it
arrived has looked for it. With a host lock
(app.host_locks) the passes of the processes of one host over a topic take turns as well.

The passes themselves are the caller's (app.leasing); this module only orders them, so its
guarantees are tested without Cassandra.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

T = TypeVar("T")
POLL_INTERVAL_MS = 25
PASS_MAX = 1000  # messages one pass leases at most (the head of the queue fits within it)


@dataclasses.dataclass(eq=False)
class Waiter(Generic[T]):
    """One waiting lease call: how many messages it wants and the caller's terms (lease
    length, consumer name) for the pass to apply."""

    want: int
    terms: Any
    deadline: float  # monotonic seconds
    served: bool = False  # a pass that started after this call arrived has looked for it
    in_pass: bool = False  # a pass is leasing for this call right now
    in_hand: bool = False  # a hand-out is deciding what this call gets right now
    got: list[T] | None = None
    error: BaseException | None = None


@dataclasses.dataclass
class _Group(Generic[T]):
    queue: list[Waiter[T]] = dataclasses.field(default_factory=list)
    running: bool = False  # a pass
    handing: bool = False  # a hand-out (app.pull_ahead); it may run beside a pass
    last_start: float = float("-inf")  # monotonic seconds
    rest_until: float = float("-inf")  # monotonic seconds: no interval pass before it
    wakes: int = 0  # wake-ups heard while the group existed
    found_nothing: bool = False  # the last pass that ended leased nothing for anyone

    def next_pass(self, interval_s: float) -> float:
        """When the next interval pass is due (monotonic seconds)."""
        return max(self.last_start + interval_s, self.rest_until)


Pass = Callable[[Sequence[Waiter[T]]], Sequence[list[T]]]
Spill = Callable[[Any, list[T]], None]  # (a call's terms, what a pass leased for it too late)


def _no_host_lock(key: Hashable) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def _never(key: Hashable) -> float | None:
    return None


def _answer(w: Waiter[T], share: list[T], error: BaseException | None,
            spilled: list[tuple[Any, list[T]]]) -> None:
    """Give a call what a pass or a hand-out found for it (holding the groups' lock). The
    first answer stands: a later share goes to `spilled` (to be held for the next call,
    never lost), and a later error is dropped."""
    answered = w.got is not None or w.error is not None
    if error is not None:
        if not answered:
            w.error = error
    elif share:
        if answered:
            spilled.append((w.terms, share))
        else:
            w.got = share


def _spill_all(spill: Spill[T] | None, spilled: list[tuple[Any, list[T]]]) -> None:
    """Hand each late share to spill (outside the groups' lock)."""
    for terms, items in spilled:
        if spill is not None:
            spill(terms, items)


class _Runners:
    """Daemon threads that run jobs, one job each at a time, kept for the next job once idle:
    starting a thread costs its starter a wait for the new thread to run (0.1 ms alone, more
    beside busy threads), on the path of every lease call that starts a pass."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, job: Callable[[], None]) -> None:
        """Run job on an idle thread, or on a new one if none is idle."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


class PollGroups(Generic[T]):
    """Thread-safe; one per process. With host_lock (a context manager per key, held across
    processes: app.host_locks), a pass also waits for the passes of other processes over
    the same key, and chooses whom it serves once it has the lock."""

    def __init__(self, interval_ms: int = POLL_INTERVAL_MS, pass_max: int = PASS_MAX,
                 host_lock: Callable[[Hashable], AbstractContextManager[None]] = _no_host_lock,
                 wake_at: Callable[[Hashable], float | None] = _never) -> None:
        self.interval_s = interval_ms / 1000
        self.pass_max = pass_max
        self.host_lock = host_lock
        self.wake_at = wake_at  # monotonic seconds at which a hand-out is due, per key
        self._groups: dict[Hashable, _Group[T]] = {}
        self._changed = threading.Condition()
        self._runners = _Runners("lease-pass")

    def lease(self, key: Hashable, want: int, terms: Any, wait_ms: int,
              run_pass: Pass[T], hand_out: Pass[T] | None = None,
              spill: Spill[T] | None = None) -> list[T]:
        """Wait up to wait_ms (measured from now) for the passes over `key` to find anything for
        this call, and return what they found (at most `want`; empty once wait_ms has
        passed, but never before one pass has looked). run_pass(waiters) leases for each
        waiter at most its want and returns each one's share; it runs on a thread of its
        own, started by whichever waiting call finds a pass due, and an exception it
        raises is raised in every call it served. A call never leaves empty while a pass
        is leasing for it. hand_out(waiters), when given, runs at the moments
        wake_at(key) names, beside a pass if one is running, for every call still
        without an answer; what a pass then leases for a call a hand-out answered goes
        to spill(terms, items). Nor does a call leave empty while a hand-out is deciding
        what it gets: what it hands a call is that call's answer, late as it may be."""
        deadline = time.monotonic() + wait_ms / 1000
        me: Waiter[T] = Waiter(want, terms, deadline)
        with self._changed:
            group = self._groups.setdefault(key, _Group())
            group.queue.append(me)
        while True:
            with self._changed:
                while True:
                    if me.error is not None:
                        raise me.error
                    if me.got is not None:
                        return me.got
                    now = time.monotonic()
                    if me.served and not (me.in_pass or me.in_hand) and now >= deadline:
                        self._leave(key, group, me)
                        return []
                    if hand_out is not None and self._hand_out_due(key, group, now):
                        group.handing = True
                        break
                    if self._pass_due(group, now):
                        group.running = True
                        # on a thread of its own, so the calls' threads stay free to run
                        # the hand-outs that come due while it runs
                        self._runners.run(functools.partial(self._run, key, group, me,
                                                            run_pass, spill))
                        continue
                    self._changed.wait(self._sleep_s(key if hand_out else None, group, me,
                                                     now, deadline))
            if hand_out is not None:
                self._hand_out(key, group, hand_out, spill)

    def wakes(self, key: Hashable) -> int:
        """How many wake-ups the calls over `key` have heard: a pass takes it before its read
        and gives it to rest()."""
        with self._changed:
            group = self._groups.get(key)
            return -1 if group is None else group.wakes

    def found_nothing(self, key: Hashable) -> bool:
        """Did the last pass over `key` that ended lease nothing for any call? (A pass may
        then prepare to rest; one after passes that found something need not.)"""
        with self._changed:
            group = self._groups.get(key)
            return group is not None and group.found_nothing

    def rest(self, key: Hashable, until: float, wakes: int) -> bool:
        """No interval pass over `key` before `until` (monotonic seconds), unless woken:
        applies only while no wake-up came since wakes() returned `wakes`. Returns whether
        it applied."""
        with self._changed:
            group = self._groups.get(key)
            if group is None or group.wakes != wakes:
                return False
            group.rest_until = until
            return True

    def wake(self, key: Hashable) -> None:
        """Something may have come due over `key` (a pointer written): end its rest. Cheap
        when it is not resting (no waiting thread is woken)."""
        with self._changed:
            group = self._groups.get(key)
            if group is None:
                return
            group.wakes += 1
            if group.rest_until > time.monotonic():
                group.rest_until = float("-inf")
                self._changed.notify_all()

    def _pass_due(self, group: _Group[T], now: float) -> bool:
        """Should a pass start now: none running, and a call no pass has served yet, or an
        interval since the last pass began and the group's rest over?"""
        if group.running or not group.queue:
            return False
        return (any(not w.served for w in group.queue)
                or now >= group.next_pass(self.interval_s))

    def _hand_out_due(self, key: Hashable, group: _Group[T], now: float) -> bool:
        """Should a hand-out start now: none running (a pass may be), a call without an
        answer, and wake_at(key) has come?"""
        if group.handing or not any(w.got is None and w.error is None for w in group.queue):
            return False
        wake = self.wake_at(key)
        return wake is not None and now >= wake

    def _hand_out(self, key: Hashable, group: _Group[T], hand_out: Pass[T],
                  spill: Spill[T] | None) -> None:
        """Run one hand-out (group.handing is set) for every call still without an answer,
        those a pass is leasing for included: a call that gets messages is answered at once,
        and what the pass leases for it after all goes to spill (see _run). A call a pass
        answered while the hand-out ran keeps that answer, and its share of the hand-out goes
        to spill. An error goes to the calls it was for that no pass answered."""
        with self._changed:
            now = time.monotonic()
            batch = [w for w in group.queue
                     if w.got is None and w.error is None and now < w.deadline]
            for w in batch:
                w.in_hand = True
        shares: Sequence[list[T]] = []
        error: BaseException | None = None
        try:
            shares = hand_out(batch) if batch else []
        except BaseException as exc:  # re-raised in the calls it was for
            error = exc
        spilled: list[tuple[Any, list[T]]] = []
        with self._changed:
            group.handing = False
            for index, w in enumerate(batch):
                w.in_hand = False
                _answer(w, shares[index] if error is None else [], error, spilled)
                if (w.error is not None or w.got is not None) and not w.in_pass:
                    self._leave(key, group, w)
            self._changed.notify_all()
        _spill_all(spill, spilled)

    def _choose(self, group: _Group[T], now: float) -> list[Waiter[T]]:
        """The calls the pass starting now serves: calls no pass has served yet first, then
        the others still waiting, within pass_max messages (at least one call); in arrival
        order."""
        open_ = [w for w in group.queue if w.got is None and w.error is None]
        fresh = [w for w in open_ if not w.served]
        waiting = [w for w in open_ if w.served and now < w.deadline]
        chosen: set[int] = set()
        total = 0
        for w in fresh + waiting:
            if chosen and total + w.want > self.pass_max:
                break
            chosen.add(id(w))
            total += w.want
        batch = [w for w in group.queue if id(w) in chosen]
        for w in batch:
            w.in_pass = True
        group.last_start = now
        group.rest_until = float("-inf")  # until this pass says otherwise (rest)
        return batch

    def _sleep_s(self, key: Hashable | None, group: _Group[T], me: Waiter[T], now: float,
                 deadline: float) -> float:
        """How long a waiter may sleep before it must look again (a notify can end it sooner);
        with key, until a hand-out over it is due at the latest."""
        limits = [deadline - now] if me.served and not (me.in_pass or me.in_hand) else []
        if not group.running:
            limits.append(group.next_pass(self.interval_s) - now)
        wake = self.wake_at(key) if key is not None and not group.handing else None
        if wake is not None:  # (a hand-out running notifies when it ends)
            limits.append(wake - now)
        return max(0.0005, min(limits, default=1.0))

    def _run(self, key: Hashable, group: _Group[T], me: Waiter[T], run_pass: Pass[T],
             spill: Spill[T] | None) -> None:
        """Run one pass (group.running is set): take the host lock, choose the calls, lease
        for them, hand out the shares (or the error). A call a hand-out answered meanwhile
        keeps that answer, and what the pass leased for it goes to spill(terms, items)."""
        batch: list[Waiter[T]] = []
        shares: Sequence[list[T]] = []
        error: BaseException | None = None
        try:
            with self.host_lock(key):
                with self._changed:
                    batch = self._choose(group, time.monotonic())
                shares = run_pass(batch) if batch else []
        except BaseException as exc:  # handed to every call of the pass, re-raised there
            error = exc
        spilled: list[tuple[Any, list[T]]] = []
        with self._changed:
            group.running = False
            group.found_nothing = error is None and not any(shares)
            if error is not None and not batch:
                batch = [me]  # the lock itself failed: this call answers for it
            for index, w in enumerate(batch):
                w.served, w.in_pass = True, False
                _answer(w, shares[index] if error is None else [], error, spilled)
                if w.error is not None or w.got is not None:
                    self._leave(key, group, w)
            self._changed.notify_all()
        _spill_all(spill, spilled)

    def _leave(self, key: Hashable, group: _Group[T], w: Waiter[T]) -> None:
        if w in group.queue:
            group.queue.remove(w)
        if (not group.queue and not group.running and not group.handing
                and self._groups.get(key) is group):
            del self._groups[key]
