"""The quiet topics of one process, checked together (app.quiet_marks).

A long poll on a topic where a pass found nothing rests, and a lost wake-up must still not
delay a message by more than an idle period (Config.pull_idle_ms). A topic under a quiet
mark needs no timeline read for that, only its write counts; but read topic by topic, on
each topic's own moment, those checks were one request per topic and idle period in every
process, and each woke the topic's waiting threads to run a pass.

Instead, a topic resting under a mark is watched: once every period (on its epoch
multiples), one thread reads the counts of every watched topic together, one request per
CHUNK topics, and wakes each topic whose counts moved (`on_moved`: its mark is dropped and
its long polls read at once). A topic leaves the watch when its mark no longer stands: its
rest ends then (app.leasing), and its next pass reads the timeline and leaves a new mark. A
failed read wakes every watched topic, whose own passes then read (and meet the outage
themselves).

What this guarantees is what a topic's own count check guaranteed: a pointer whose writer's
wake-up was lost, counted after the mark's read, is found within a period and the time of one
read after it was counted. Thread-safe; the thread starts with the first watch (after a
gunicorn fork) and runs until close().
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

from app import metrics
from app.chunks import chunked
from app.quiet_marks import QuietMark

CHUNK = 50  # topics per read: with two buckets each, 100 partitions

log = logging.getLogger("duetime.pull")

CountsReader = Callable[[Sequence[uuid.UUID], Sequence[int]],
                        dict[uuid.UUID, dict[tuple[int, int], int]]]


class QuietWatch:
    def __init__(self, standing: Callable[[uuid.UUID, int], QuietMark | None],
                 read_counts: CountsReader, on_moved: Callable[[uuid.UUID], None],
                 period_ms: int, window_ms: int, clock: Callable[[], int]) -> None:
        """standing(topic, window_end_ms): the topic's mark if it stands for a pass whose
        window ends then (app.quiet_marks.QuietMarks.standing); read_counts(topics,
        buckets): {topic: {(bucket, shard): n}}; window_ms: how far past the check a pass
        may lease (the look-ahead); clock: epoch ms."""
        self.standing = standing
        self.read_counts = read_counts
        self.on_moved = on_moved
        self.period_s = period_ms / 1000
        self.window_ms = window_ms
        self.clock = clock
        self._watched: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, topic_uid: uuid.UUID) -> None:
        """Check this topic's counts at every period while its mark stands."""
        with self._lock:
            self._watched.add(topic_uid)
            if self.period_s > 0 and not self._stop.is_set() and (
                    self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="quiet-watch",
                                                daemon=True)
                self._thread.start()

    def watching(self) -> frozenset[uuid.UUID]:
        with self._lock:
            return frozenset(self._watched)

    def check(self) -> list[uuid.UUID]:
        """One check of every watched topic; returns those woken (counts moved, or not read).
        Topics whose marks no longer stand leave the watch unread."""
        window_end = self.clock() + self.window_ms
        by_buckets: dict[tuple[int, ...], list[tuple[uuid.UUID, QuietMark]]] = defaultdict(list)
        # under the lock: a pass that leaves a new mark watches the topic after keeping it,
        # so it is either seen standing here or watched again after this drops the old one
        with self._lock:
            for topic_uid in list(self._watched):
                mark = self.standing(topic_uid, window_end)
                if mark is None:
                    self._watched.discard(topic_uid)
                else:
                    by_buckets[mark.buckets].append((topic_uid, mark))
        woken: list[uuid.UUID] = []
        for buckets, marked in by_buckets.items():
            for chunk in chunked(marked, CHUNK):
                woken += self._check_chunk(buckets, chunk)
        return woken

    def _check_chunk(self, buckets: tuple[int, ...],
                     marked: list[tuple[uuid.UUID, QuietMark]]) -> list[uuid.UUID]:
        try:
            counts = self.read_counts([topic_uid for topic_uid, _ in marked], buckets)
        except Exception as exc:  # the topics' own passes read, and meet it themselves
            log.warning("quiet topics' write counts not read: %s", type(exc).__name__)
            moved = [topic_uid for topic_uid, _ in marked]
        else:
            moved = [topic_uid for topic_uid, mark in marked
                     if counts.get(topic_uid, {}) != mark.counts]
            metrics.QUIET_CHECKS.inc(len(marked) - len(moved))
        with self._lock:
            self._watched.difference_update(moved)
        for topic_uid in moved:
            self.on_moved(topic_uid)
        return moved

    def _run(self) -> None:
        while not self._stop.wait(self._until_next_s()):
            try:
                self.check()
            except Exception:  # never let the thread die: the next period checks again
                log.exception("quiet topics not checked")

    def _until_next_s(self) -> float:
        """Seconds to the next epoch multiple of the period."""
        now = time.time()
        return math.floor(now / self.period_s + 1) * self.period_s - now

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
