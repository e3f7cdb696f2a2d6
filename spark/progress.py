"""Progress of a long Spark job on stderr, so a person running a million-row import sees it
move: a line when a phase starts, and every few seconds one bar per running Spark stage (a
phase may run several, one after another or at once), each with its tasks done / total, the
rows its finished tasks read or wrote, and the time left at its pace so far. A stage's bar
only grows, and the stage gets a last one when it has ended."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import SparkContext

EVERY_S = 2.0
WIDTH = 30


def bar(done: int, total: int, width: int = WIDTH) -> str:
    """`[#########.....] 61% 6,100/10,000` (the client's progress bar, which the server
    does not depend on)."""
    share = min(max(done / total, 0.0), 1.0) if total else 0.0
    filled = round(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {done:,}/{total:,}"


def time_left(elapsed_s: float, done: int, total: int) -> str:
    """`about 12 s left` at the pace of the elapsed_s that did `done` of `total` tasks."""
    if done >= total:
        return "done"
    if not done:
        return "time left unknown yet"
    left = elapsed_s / done * (total - done)
    return f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"


class Progress:
    def __init__(self, sc: SparkContext, every_s: float = EVERY_S) -> None:
        self.sc = sc
        self.every_s = every_s
        self.phase = "starting"
        self.started = time.monotonic()
        self._stages: dict[int, tuple[str, float]] = {}  # running: (its phase, first seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:  # a failure says what went wrong itself (spark.failures)
            self.say(f"finished in {time.monotonic() - self.started:.1f} s")

    def enter(self, phase: str) -> None:
        """Name the next phase (also shown as the job description in the Spark UI)."""
        self.phase = phase
        self.sc.setJobDescription(phase)
        self.say(phase)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._look()
            except Py4JError:  # the context is stopping: nothing more to show
                return

    def _look(self) -> None:
        tracker = self.sc.statusTracker()
        active = set(tracker.getActiveStageIds())
        for stage_id in sorted(active - set(self._stages)):
            self._stages[stage_id] = (self.phase, time.monotonic())
        for stage_id in sorted(self._stages):
            info = tracker.getStageInfo(stage_id)
            phase, since = self._stages[stage_id]
            if stage_id not in active:
                del self._stages[stage_id]
            if info is None:
                continue
            done, total = info.numCompletedTasks, info.numTasks
            self.say(f"{phase}: stage {stage_id} tasks {bar(done, total)}, "
                     f"{self._rows(stage_id):,} rows, " + (
                         "ended" if stage_id not in active
                         else time_left(time.monotonic() - since, done, total)))

    def _rows(self, stage_id: int) -> int:
        """Rows the stage's finished tasks (and the running ones at their last heartbeat)
        read from files, tables or cache, read from a shuffle, or wrote: the largest."""
        try:
            data: Any = self.sc._jsc.sc().statusStore().lastStageAttempt(stage_id)
        except Py4JJavaError:  # no longer kept: no rows to tell
            return 0
        return max(data.inputRecords(), data.shuffleReadRecords(), data.outputRecords())
