"""workers/beat.py: an idle releaser's polls fall on one grid of wall-clock instants, so they
reach Cassandra together (no Cassandra here: the grid, the trigger and paced steps on it)."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import UTC, datetime

import pytest

from workers.beat import Beat, OnGrid
from workers.paced import PacedStep


def test_the_grid_is_epoch_multiples_and_an_idle_run_comes_at_its_last_beat() -> None:
    beat = Beat(5000 / 3)
    assert beat.at_or_before(10.0) == pytest.approx(10.0)
    assert beat.at_or_before(10.0 + 0.01) == pytest.approx(10.0)  # just after: on it
    assert beat.at_or_before(10.0 - 0.1) == pytest.approx(10.0 - 5 / 3)
    # a 5 s period is three beats; a 2 s one becomes one beat (never late, at most one early)
    assert beat.idle_until(10.003, 5.0, 0.05) == pytest.approx(15.0)
    assert beat.idle_until(10.003, 2.0, 0.05) == pytest.approx(10.0 + 5 / 3)
    # a run off the grid (woken) goes back onto it
    assert beat.idle_until(10.9, 2.0, 0.05) == pytest.approx(10.0 + 5 / 3)
    # an idle period shorter than a beat keeps its own pace
    assert beat.idle_until(10.9, 0.5, 0.05) == pytest.approx(11.4)


def test_periods_become_whole_beats_or_equal_divisions_of_one() -> None:
    beat = Beat(5000 / 3)
    assert beat.every(5000 / 3) == pytest.approx(5000 / 3)  # the ownership tick itself
    assert beat.every(10_000) == pytest.approx(10_000)  # six beats
    assert beat.every(2_000) == pytest.approx(5000 / 3)  # at most the period asked
    assert beat.every(500) == pytest.approx(5000 / 12)  # a quarter beat: every beat is a tick


def test_the_trigger_fires_on_the_grid_without_drift() -> None:
    trigger = OnGrid(5000 / 12)
    now = datetime.fromtimestamp(1_800_000_000.123, tz=UTC)
    fired = trigger.get_next_fire_time(None, now)
    times = [fired]
    for _ in range(100_000):  # about 11.6 hours of a quarter-beat job
        fired = trigger.get_next_fire_time(fired, fired)
        times.append(fired)
    step = 5 / 12
    for t in (times[0], times[-1]):
        phase = t.timestamp() / step
        assert abs(phase - round(phase)) * step < 1e-5  # still on an epoch multiple
    assert all(b > a for a, b in itertools.pairwise(times))
    assert times[-1].timestamp() - times[0].timestamp() == pytest.approx(100_000 * step)


def test_idle_runs_of_steps_with_different_periods_fall_on_the_same_beats() -> None:
    beat = Beat(500)
    periods = {"every 1 s": 1.0, "every 1.5 s": 1.5}
    runs: dict[str, list[float]] = {name: [] for name in periods}
    done = threading.Event()

    def recorder(name: str) -> None:
        runs[name].append(time.time())
        if all(len(r) >= 4 for r in runs.values()):
            done.set()

    steps = [PacedStep(name, lambda name=name: recorder(name), 20, int(period * 1000),
                       lambda f: f(), beat=beat)
             for name, period in periods.items()]
    for step in steps:
        step.start()
    try:
        assert done.wait(10), runs
    finally:
        for step in steps:
            step.stop()
    for name, period in periods.items():
        idle_runs = runs[name][1:]  # the first ran at start, off the grid
        phases = [t % 0.5 for t in idle_runs]
        assert all(p < 0.15 for p in phases), (name, phases)  # just after a beat
        gaps = [b - a for a, b in itertools.pairwise(idle_runs)]
        assert all(period - 0.15 < g < period + 0.15 for g in gaps), (name, gaps)
