"""How the lease calls of one process share passes over a topic (app.poll_groups).

The passes here are stand-ins that record what they were asked: this tests the ordering of
calls and passes, a concurrency rule of one process, not storage (tests/test_leasing.py runs
the real passes against Cassandra).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Hashable, Iterator, Sequence

import pytest

from app.poll_groups import PollGroups, Waiter


class Passes:
    """A pass that hands each waiter what `supply` held when the pass started (as a scan
    reads what is due at its start), in order, then takes duration_s; records its batches
    and start times (monotonic seconds)."""

    def __init__(self, supply: list[int] | None = None, duration_s: float = 0.0) -> None:
        self.supply = supply if supply is not None else []
        self.duration_s = duration_s
        self.batches: list[list[int]] = []
        self.started: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        shares = []
        with self.lock:
            self.started.append(time.monotonic())
            self.batches.append([w.terms for w in waiters])
            for w in waiters:
                shares.append(self.supply[:w.want])
                del self.supply[:w.want]
        time.sleep(self.duration_s)
        return shares


def _call(groups: PollGroups[int], passes: Passes, want: int, terms: int, wait_ms: int,
          out: dict[int, list[int]], key: str = "t") -> threading.Thread:
    thread = threading.Thread(target=lambda: out.__setitem__(
        terms, groups.lease(key, want, terms, wait_ms, passes)))
    thread.start()
    return thread


def test_calls_waiting_together_share_one_pass_in_arrival_order() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    passes = Passes(duration_s=0.05)
    out: dict[int, list[int]] = {}
    first = _call(groups, passes, 2, 0, 2000, out)  # runs the first pass (empty supply)
    time.sleep(0.01)
    later = [_call(groups, passes, 2, n, 2000, out) for n in (1, 2, 3)]
    time.sleep(0.02)
    passes.supply.extend(range(100, 108))  # due now: the next pass finds them
    for t in [first, *later]:
        t.join(5)
    assert passes.batches[0] == [0]
    assert passes.batches[1] == [0, 1, 2, 3]  # one pass for all four calls, oldest first
    assert out == {0: [100, 101], 1: [102, 103], 2: [104, 105], 3: [106, 107]}


def test_a_call_is_answered_only_after_a_pass_that_started_after_it_arrived() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    passes = Passes(duration_s=0.1)
    out: dict[int, list[int]] = {}
    running = _call(groups, passes, 1, 0, 0, out)
    time.sleep(0.03)  # that call's pass is running and did not see what is due now
    passes.supply.append(7)
    arrived = time.monotonic()
    late = _call(groups, passes, 1, 1, 0, out)  # wait_ms 0: one pass of its own, no more
    running.join(5)
    late.join(5)
    assert out == {0: [], 1: [7]}
    assert len(passes.started) == 2 and passes.started[1] >= arrived


def test_idle_long_polls_cost_one_pass_per_interval_not_one_per_call() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    passes = Passes()
    out: dict[int, list[int]] = {}
    began = time.monotonic()
    calls = [_call(groups, passes, 10, n, 300, out) for n in range(8)]
    for t in calls:
        t.join(5)
    elapsed = time.monotonic() - began
    assert out == {n: [] for n in range(8)}
    # at most one pass per fresh call, then one pass per 25 ms for all of them (one pass
    # per call and interval would be about 8 x 12)
    assert len(passes.started) <= 8 + elapsed / 0.025 + 1, len(passes.started)
    gaps = [b - a for a, b in zip(passes.started[8:], passes.started[9:], strict=False)]
    assert all(gap >= 0.024 for gap in gaps), gaps


def test_a_pass_never_loses_what_it_leased_for_a_call_whose_wait_ran_out() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    passes = Passes(supply=[1, 2, 3], duration_s=0.2)  # the pass outlasts the call's wait
    out: dict[int, list[int]] = {}
    _call(groups, passes, 3, 0, 10, out).join(5)
    assert out == {0: [1, 2, 3]}


def test_a_failed_pass_fails_every_call_it_served_and_no_other_topic() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    started = threading.Event()

    def broken(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        started.set()
        time.sleep(0.05)
        raise RuntimeError("Cassandra is down")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            groups.lease("t", 1, 0, 1000, broken)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    assert started.wait(5)
    other = Passes(supply=[9])
    assert groups.lease("other", 1, 0, 1000, other) == [9]  # not held up by "t"
    for t in threads:
        t.join(5)
    assert len(errors) == 3 and {str(e) for e in errors} == {"Cassandra is down"}
    assert groups.lease("t", 1, 0, 0, Passes(supply=[5])) == [5]  # the topic recovers


def test_a_pass_serves_the_head_of_the_queue_within_its_cap() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25, pass_max=5)
    passes = Passes(duration_s=0.05)
    out: dict[int, list[int]] = {}
    first = _call(groups, passes, 1, 0, 0, out)
    time.sleep(0.01)
    rest = [_call(groups, passes, 3, n, 0, out) for n in (1, 2, 3)]
    for t in [first, *rest]:
        t.join(5)
    assert passes.batches[0] == [0]
    assert passes.batches[1] == [1]  # 3 + 3 > 5: the next call waits for the next pass
    assert sorted(passes.batches[2:]) == [[2], [3]]
    assert out == {n: [] for n in range(4)}


@pytest.mark.parametrize("wait_ms", [0, 100])
def test_a_call_that_finds_nothing_waits_out_its_wait(wait_ms: int) -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    began = time.monotonic()
    assert groups.lease("t", 5, 0, wait_ms, Passes()) == []
    assert time.monotonic() - began >= wait_ms / 1000


def test_a_pass_waiting_for_the_host_lock_serves_the_calls_that_arrive_meanwhile() -> None:
    held = threading.Lock()

    @contextlib.contextmanager
    def host_lock(key: Hashable) -> Iterator[None]:
        with held:
            yield

    groups: PollGroups[int] = PollGroups(interval_ms=25, host_lock=host_lock)
    passes = Passes(supply=[1, 2])
    out: dict[int, list[int]] = {}
    with held:  # another process's pass over the topic
        first = _call(groups, passes, 1, 0, 1000, out)
        time.sleep(0.03)
        second = _call(groups, passes, 1, 1, 1000, out)
        time.sleep(0.03)
        assert passes.batches == []
    first.join(5)
    second.join(5)
    assert passes.batches == [[0, 1]] and out == {0: [1], 1: [2]}


def test_a_host_lock_that_fails_fails_the_call_that_took_it() -> None:
    def broken(key: Hashable) -> contextlib.AbstractContextManager[None]:
        raise OSError("no lock directory")

    groups: PollGroups[int] = PollGroups(host_lock=broken)
    with pytest.raises(OSError, match="no lock directory"):
        groups.lease("t", 1, 0, 1000, Passes(supply=[1]))


def test_a_hand_out_runs_at_the_wake_time_without_the_host_lock() -> None:
    wake = time.monotonic() + 0.3
    handed: list[float] = []
    locked: list[Hashable] = []

    def hand_out(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        handed.append(time.monotonic())
        return [[7] for _ in waiters]

    def host_lock(key: Hashable) -> contextlib.AbstractContextManager[None]:
        locked.append(key)
        return contextlib.nullcontext()

    groups: PollGroups[int] = PollGroups(interval_ms=10_000, host_lock=host_lock,
                                         wake_at=lambda key: None if handed else wake)
    passes = Passes()  # nothing due: only the call's first pass, then the hand-out
    assert groups.lease("t", 1, "a", 2000, passes, hand_out) == [7]
    assert len(handed) == 1 and handed[0] >= wake
    assert len(passes.batches) == 1 and locked == ["t"]  # the pass took the lock; not it


def test_without_a_hand_out_a_wake_time_neither_starts_nor_wakes_anything() -> None:
    asked: list[float] = []

    def wake_at(key: Hashable) -> float:
        asked.append(time.monotonic())
        return time.monotonic() - 1  # overdue

    groups: PollGroups[int] = PollGroups(interval_ms=10_000, wake_at=wake_at)
    passes = Passes()
    began = time.monotonic()
    assert groups.lease("t", 1, "a", 300, passes) == []
    assert time.monotonic() - began >= 0.3 and len(passes.batches) == 1
    assert asked == []  # no waking to look at it (a busy loop, were it overdue)


def test_a_hand_out_answers_a_call_a_pass_is_leasing_for_and_the_pass_spills() -> None:
    began = time.monotonic()
    handed: list[float] = []
    spilled: list[tuple[object, list[int]]] = []

    def hand_out(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        handed.append(time.monotonic())
        return [[7] for _ in waiters]

    groups: PollGroups[int] = PollGroups(
        interval_ms=10_000, wake_at=lambda key: None if handed else began + 0.1)
    passes = Passes(supply=[9], duration_s=0.3)  # the call's first pass, still running at 0.1
    got = groups.lease("t", 1, "a", 2000, passes, hand_out,
                       lambda terms, items: spilled.append((terms, items)))
    answered = time.monotonic() - began
    assert got == [7] and answered < 0.3  # not held until the pass ended
    deadline = time.monotonic() + 2
    while not spilled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spilled == [("a", [9])]  # what the pass leased for it is not lost


def test_a_hand_out_never_loses_what_it_handed_a_call_whose_wait_ran_out() -> None:
    # Two served calls wait; a hand-out starts for both on the thread of the long one and
    # outlasts the short one's wait. The short call must leave with its share, not empty
    # (its messages are leased: dropped here, they would come back only when the lease ends).
    began = time.monotonic()
    handed: list[float] = []

    def hand_out(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        handed.append(time.monotonic())
        time.sleep(0.3)  # a slow check read
        return [[w.terms] for w in waiters]

    out: dict[int, list[int]] = {}
    long_call = threading.Thread(target=lambda: out.__setitem__(
        1, groups.lease("t", 1, 1, 5000, passes, hand_out)))

    def wake_at(key: Hashable) -> float | None:
        # only the long call's thread sees the wake time, so that it runs the hand-out
        mine = threading.current_thread() is long_call
        return None if handed or not mine else began + 0.1

    groups: PollGroups[int] = PollGroups(interval_ms=10_000, wake_at=wake_at)
    passes = Passes()  # nothing due: each call's first pass finds nothing
    long_call.start()
    time.sleep(0.05)  # its pass done; it waits for the hand-out at 0.1
    out[2] = groups.lease("t", 1, 2, 150, passes, hand_out)  # wait ends during the hand-out
    long_call.join(5)
    assert len(handed) == 1
    assert out == {1: [1], 2: [2]}


def test_a_pass_and_a_hand_out_that_answer_one_call_together_lose_neither_share() -> None:
    # The call's first pass is still leasing for it when a hand-out for it starts; the pass
    # ends first. The call leaves with one share; the other goes to spill, not lost.
    began = time.monotonic()
    handed: list[float] = []
    spilled: list[tuple[object, list[int]]] = []

    def hand_out(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        handed.append(time.monotonic())
        time.sleep(0.3)  # a slow check read, outlasting the pass
        return [[7] for _ in waiters]

    groups: PollGroups[int] = PollGroups(
        interval_ms=10_000, wake_at=lambda key: None if handed else began + 0.1)
    passes = Passes(supply=[9], duration_s=0.2)  # running from 0 to 0.2
    got = groups.lease("t", 1, "a", 2000, passes, hand_out,
                       lambda terms, items: spilled.append((terms, items)))
    assert len(handed) == 1
    assert sorted(got + [m for _, items in spilled for m in items]) == [7, 9]
    assert len(got) == 1 and all(terms == "a" for terms, _ in spilled)


def test_passes_run_on_threads_kept_for_the_next_passes() -> None:
    """A pass starts on a thread left idle by an earlier one (starting a thread is a wait
    on the call's path); passes over two topics at once each get a thread."""
    groups: PollGroups[int] = PollGroups(interval_ms=25)
    threads: list[int] = []

    def recording(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        threads.append(threading.get_ident())
        return [[1] for _ in waiters]

    for _ in range(5):
        assert groups.lease("t", 1, 0, 0, recording) == [1]
        time.sleep(0.02)  # the pass's thread marks itself idle just after the call's answer
    assert len(set(threads)) == 1 and threading.get_ident() not in threads

    both = threading.Barrier(2, timeout=5)

    def meeting(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        both.wait()  # returns only while the other topic's pass runs too
        return [[2] for _ in waiters]

    out: dict[int, list[int]] = {}
    calls = [threading.Thread(target=lambda key=key, n=n: out.__setitem__(
        n, groups.lease(key, 1, n, 0, meeting))) for n, key in enumerate(("a", "b"))]
    for call in calls:
        call.start()
    for call in calls:
        call.join(10)
    assert out == {0: [2], 1: [2]}


def test_a_resting_topic_has_no_interval_pass_until_its_rest_ends() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=10)
    passes = Passes()

    def resting_pass(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        wakes = groups.wakes("t")
        shares = passes(waiters)
        if len(passes.started) == 1:  # the first pass found nothing: rest for 0.4 s
            assert groups.rest("t", time.monotonic() + 0.4, wakes)
        return shares

    out: dict[int, list[int]] = {}
    thread = threading.Thread(target=lambda: out.__setitem__(
        0, groups.lease("t", 1, 0, 1000, resting_pass)))
    thread.start()
    thread.join(5)
    assert out == {0: []}
    gaps = [b - a for a, b in zip(passes.started, passes.started[1:], strict=False)]
    # unrested, a 10 ms interval makes about 100 passes in the call's second
    assert gaps[0] >= 0.39 and len(passes.started) < 70, (gaps[:3], len(passes.started))


def test_a_wake_up_ends_a_rest_at_once_and_one_during_a_pass_voids_its_rest() -> None:
    groups: PollGroups[int] = PollGroups(interval_ms=10)
    passes = Passes()
    woken_during: list[bool] = []

    def resting_pass(waiters: Sequence[Waiter[int]]) -> list[list[int]]:
        wakes = groups.wakes("t")
        shares = passes(waiters)
        if len(passes.started) == 2:  # a write lands while this pass reads
            groups.wake("t")
        woken_during.append(not groups.rest("t", time.monotonic() + 5, wakes))
        return shares

    out: dict[int, list[int]] = {}
    thread = threading.Thread(target=lambda: out.__setitem__(
        0, groups.lease("t", 1, 0, 3000, resting_pass)))
    thread.start()
    time.sleep(0.3)  # the first pass rested for 5 s; the second has not run
    assert len(passes.started) == 1
    passes.supply.append(9)
    woke = time.monotonic()
    groups.wake("t")
    thread.join(5)
    # the wake-up started the second pass at once, and found the message; the wake-up
    # that came while it ran made its rest void
    assert out == {0: [9]} and woken_during[:2] == [False, True]
    assert passes.started[1] - woke < 0.05 and len(passes.started) == 2
