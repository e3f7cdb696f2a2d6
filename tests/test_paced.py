"""A releaser's paced steps (workers/paced.py) without Cassandra: a step runs at once when
woken, and without a wake-up only at the ownership tick that ends its idle period (the tick
owns every step's idle run, so an idle releaser polls at one instant a tick)."""

from __future__ import annotations

import time
from collections.abc import Callable

from workers.paced import PacedStep, Step
from workers.releaser import whole_ticks


def _run(step: Step) -> bool | None:
    return step()


def _recording(idle_ticks: int) -> tuple[PacedStep, list[float]]:
    runs: list[float] = []

    def step() -> None:
        runs.append(time.monotonic())

    return PacedStep("step", step, 10, idle_ticks, _run), runs


def _until(check: Callable[[], bool], within_s: float = 5) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_an_idle_step_runs_at_the_tick_that_ends_its_idle_period_and_not_before() -> None:
    paced, runs = _recording(idle_ticks=3)
    paced.start()
    try:
        assert _until(lambda: len(runs) == 1)  # its first run, at start
        for _ in range(2):
            paced.tick()
            time.sleep(0.1)
        assert len(runs) == 1, "ran before its third tick"
        paced.tick()
        assert _until(lambda: len(runs) == 2), "the third tick did not run it"
        time.sleep(0.3)
        assert len(runs) == 2, "ran again without a tick or a wake-up"
    finally:
        paced.stop(5)


def test_a_wake_up_runs_it_at_once_and_starts_its_idle_period_again() -> None:
    paced, runs = _recording(idle_ticks=2)
    paced.start()
    try:
        assert _until(lambda: len(runs) == 1)
        paced.tick()
        paced.wake()
        assert _until(lambda: len(runs) == 2), "a wake-up did not run it"
        time.sleep(0.05)
        paced.tick()  # one tick since the woken run: not idle long enough
        time.sleep(0.2)
        assert len(runs) == 2
        paced.tick()
        assert _until(lambda: len(runs) == 3)
    finally:
        paced.stop(5)


def test_a_stop_ends_a_step_that_waits_for_its_tick() -> None:
    paced, runs = _recording(idle_ticks=1000)
    paced.start()
    assert _until(lambda: len(runs) == 1)
    began = time.monotonic()
    paced.stop(5)
    assert time.monotonic() - began < 1
    assert not paced._thread.is_alive()


def test_idle_periods_are_whole_ticks_of_a_third_of_the_lease() -> None:
    assert whole_ticks(2000, 5000) == 1  # the walk's 2 s: one 1.67 s tick
    assert whole_ticks(5000, 5000) == 3  # exactly three, not two by a float's rounding
    assert whole_ticks(10_000, 5000) == 6
    assert whole_ticks(500, 5000) == 1  # shorter than a tick: at the tick
    assert whole_ticks(20_000, 2000) == 30
