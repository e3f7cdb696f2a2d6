"""A releaser step run on a thread of its own, at two paces: soon after a wake-up
(app.delivery.wakeups), at most every busy_ms, and without one once idle_ticks of the releaser's
ownership ticks have passed since its last run (the safety net of a lost wake-up: the tick
owns every step's idle run, so an idle releaser's reads reach Cassandra together, right after
the tick's own). A step that reports itself busy (returns True) runs again at the busy pace
without a wake.

A wake-up that arrives while the step runs makes one more run after it: the run under way
may have read before the write the wake-up announced. For its first warm_ms a step runs at
the busy pace: other processes learn of a new releaser's address only that long after it
started (app.delivery.wakeups.ADDRESSES_EVERY_MS), and until then its wake-ups go elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.ops import metrics

log = logging.getLogger("duetime.releaser")

Step = Callable[[], "bool | None"]


class PacedStep:
    def __init__(self, name: str, step: Step, busy_ms: int, idle_ticks: int,
                 run: Callable[[Step], bool | None], warm_ms: int = 0) -> None:
        """run(step) runs one step and returns what it returned (the releaser's error
        handling)."""
        self.name = name
        self.busy_ms = busy_ms
        self.idle_ticks = max(1, idle_ticks)
        self._ticks = 0  # ownership ticks since the last run began
        self.warm_ms = warm_ms
        self._warm_until = 0.0
        self.runs = 0
        self.woken_runs = 0  # of runs, those a wake-up prompted
        self._step = step
        self._run = run
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._warm_until = time.monotonic() + self.warm_ms / 1000
        self._thread.start()

    def wake(self) -> None:
        self._woken.set()

    def warming(self) -> bool:
        """Whether the step is in its first warm_ms, when wake-ups may not reach it yet."""
        return time.monotonic() < self._warm_until

    def tick(self) -> None:
        """The releaser's ownership tick: a step that has not run for idle_ticks of them
        runs now."""
        self._ticks += 1
        if self._ticks >= self.idle_ticks:
            self._woken.set()

    def stop(self, within_s: float | None = None) -> None:
        """Stop after the run under way (if any) and wait for it, at most within_s (None:
        as long as it takes); the thread is a daemon, so one still running then cannot
        keep the process from exiting."""
        self._stopping.set()
        self._woken.set()
        if self._thread.is_alive():
            self._thread.join(within_s)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            woken = self._woken.is_set()
            self._woken.clear()
            self._ticks = 0
            busy = self._run(self._step)
            ran = time.monotonic() - began
            metrics.RELEASER_STEP_DURATION.labels(self.name).observe(ran)
            self.runs += 1
            self.woken_runs += woken
            if self._stopping.wait(max(0.0, self.busy_ms / 1000 - ran)):
                return
            if not busy and not self.warming():
                self._woken.wait()  # a wake-up, a tick or stop()
