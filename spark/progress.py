"""Progress of a long Spark job on stderr: the phase and its tasks done / total, every few
seconds, so a person running a million-row import sees it move."""

from __future__ import annotations

import sys
import threading
import time

from pyspark import SparkContext

EVERY_S = 2.0
WIDTH = 30


def bar(done: int, total: int, width: int = WIDTH) -> str:
    """`[#########.....] 61% 6,100/10,000` (the client's progress bar, which the server
    does not depend on)."""
    share = min(max(done / total, 0.0), 1.0) if total else 0.0
    filled = round(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {done:,}/{total:,}"


class Progress:
    def __init__(self, sc: SparkContext, every_s: float = EVERY_S) -> None:
        self.sc = sc
        self.every_s = every_s
        self.phase = "starting"
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.say(f"finished in {time.monotonic() - self.started:.1f} s")

    def enter(self, phase: str) -> None:
        """Name the next phase (also shown as the job description in the Spark UI)."""
        self.phase = phase
        self.sc.setJobDescription(phase)
        self.say(phase)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.every_s):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done, total = done + info.numCompletedTasks, total + info.numTasks
            if total:
                self.say(f"{self.phase}: tasks {bar(done, total)}")
