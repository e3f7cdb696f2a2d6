"""A releaser step run on a thread of its own, at two paces: soon after a wake-up
(app.delivery.wakeups), at most every busy_ms, and without one every idle_ms (the safety net of a
lost wake-up). A step that reports itself busy (returns True) runs again at the busy pace without
a wake.

A wake-up that arrives while the step runs makes one more run after it: the run under way
may have read before the write the wake-up announced. For its first warm_ms a step runs at
the busy pace: other processes learn of a new releaser's address only that long after it
started (app.delivery.wakeups.ADDRESSES_EVERY_MS), and until then its wake-ups go elsewhere.

With a beat (workers/beat.py), the idle runs of every step fall on the same instants, so an
idle releaser's reads reach Cassandra together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.ops import metrics
from workers.beat import Beat

log = logging.getLogger("duetime.releaser")

Step = Callable[[], "bool | None"]


class PacedStep:
    def __init__(self, name: str, step: Step, busy_ms: int, idle_ms: int,
                 run: Callable[[Step], bool | None], warm_ms: int = 0,
                 beat: Beat | None = None) -> None:
        """run(step) runs one step and returns what it returned (the releaser's error
        handling); busy_ms <= idle_ms. With a beat, an idle run comes at the last beat at
        most idle_ms after the previous one began."""
        self.name = name
        self.beat = beat
        self.busy_ms = busy_ms
        self.idle_ms = max(busy_ms, idle_ms)
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
            began, began_wall = time.monotonic(), time.time()
            woken = self._woken.is_set()
            self._woken.clear()
            busy = self._run(self._step)
            ran = time.monotonic() - began
            metrics.RELEASER_STEP_DURATION.labels(self.name).observe(ran)
            self.runs += 1
            self.woken_runs += woken
            if self._stopping.wait(max(0.0, self.busy_ms / 1000 - ran)):
                return
            if not busy and time.monotonic() >= self._warm_until:
                self._woken.wait(self._idle_wait_s(began, began_wall))

    def _idle_wait_s(self, began: float, began_wall: float) -> float:
        """How long to wait for a wake-up before the next idle run."""
        if self.beat is None:
            return self.idle_ms / 1000 - (time.monotonic() - began)
        return self.beat.idle_until(began_wall, self.idle_ms / 1000,
                                    self.busy_ms / 1000) - time.time()
