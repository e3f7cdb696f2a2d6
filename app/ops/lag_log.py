"""Delivery lag per topic and minute, kept by each process and written to Cassandra for the
dashboard (app.store.lag), beside the process's Prometheus histogram (app.ops.metrics).

A process adds up the lags it observes per (topic, minute) and rewrites its totals every
FLUSH_S seconds from a daemon thread, under a writer id of its own (made after fork, so
gunicorn workers never share one). A process that closes writes what is left (an API worker
closes when gunicorn stops it); what one observed in its last FLUSH_S before it died is not
written: the chart is a view, the metrics are the record.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable

from app.core.timeline import MS_PER_MINUTE
from app.ops import metrics
from app.store.lag import LAG_EDGES_MS, LagMinute, LagStore

FLUSH_S = 5.0
log = logging.getLogger("duetime.lag")


class LagLog:
    def __init__(self, store: LagStore, clock: Callable[[], int],
                 flush_s: float = FLUSH_S) -> None:
        self.store = store
        self.clock = clock
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._minutes: dict[tuple[uuid.UUID, int], LagMinute] = {}
        self._dirty: set[tuple[uuid.UUID, int]] = set()
        self._writer: tuple[int, uuid.UUID] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, topic_uid: uuid.UUID, mode: str, lags_ms: Iterable[int]) -> None:
        """Lags (ms; negative ones, handed out ahead, count as 0) of messages of the topic
        handed out now in `mode` (pull or push)."""
        lags = [max(lag, 0) for lag in lags_ms]
        if not lags:
            return
        metrics.observe_lags(mode, lags)
        key = (topic_uid, self.clock() // MS_PER_MINUTE * MS_PER_MINUTE)
        with self._lock:
            minute = self._minutes.setdefault(key, LagMinute())
            for lag in lags:
                minute.counts[bisect.bisect_left(LAG_EDGES_MS, lag)] += 1
                minute.max_ms = max(minute.max_ms, lag)
            self._dirty.add(key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lag-log", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Write the totals of every minute that changed since the last flush; minutes before
        the previous one are forgotten once written (no more lags fall in them)."""
        with self._lock:
            pending = {key: LagMinute(list(self._minutes[key].counts), self._minutes[key].max_ms)
                       for key in self._dirty}
            self._dirty.clear()
        if not pending:
            return
        writer = self._writer_id()
        futures = [(key, self.store.write(key[0], key[1], writer, lags))
                   for key, lags in pending.items()]
        failed = []
        for key, future in futures:
            try:
                future.result()
            except Exception as exc:  # written again with the next flush
                failed.append(key)
                log.warning("delivery lag not written: %s", type(exc).__name__)
        oldest_kept = self.clock() // MS_PER_MINUTE * MS_PER_MINUTE - MS_PER_MINUTE
        with self._lock:
            self._dirty.update(failed)
            for key in [k for k in self._minutes if k[1] < oldest_kept and k not in self._dirty]:
                del self._minutes[key]

    def close(self) -> None:
        """Stop the flushing thread after one last flush."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.flush_s + 5)
        try:
            self.flush()
        except Exception as exc:
            log.warning("delivery lag not written at close: %s", type(exc).__name__)

    def _writer_id(self) -> uuid.UUID:
        pid = os.getpid()
        if self._writer is None or self._writer[0] != pid:
            self._writer = (pid, uuid.uuid4())
        return self._writer[1]

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception as exc:  # never let the thread die: the next flush retries
                log.warning("delivery lag flush failed: %s", type(exc).__name__)
