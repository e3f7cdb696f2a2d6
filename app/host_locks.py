"""One lease pass per topic at a time on this host, across processes (gunicorn workers).

Lease passes of different processes over the same topic read the same due messages and race
for them: with two API workers a third of the lease attempts lost to the other worker, and each
loss had already cost a state read, a lease pointer write and a conditional batch retried
without it. Taking turns per topic removed that waste and lowered lease latency
(docs/design.md, "Pull leases"). What each process keeps of a read for its next passes
(app.found_due) is the same in every process, so they also tell each other what they took
(app.taken_log, a file beside the lock).

The lock is flock(2) on one file per topic in a directory of this host (one per OS user):
the kernel releases it when its holder dies, so a killed worker never leaves a topic locked.
Processes on other hosts are not coordinated; between them the per-row LWT decides, as it
always does. Nothing depends on the lock for correctness, so when it cannot be taken (the
directory is not writable) a pass runs without it, as passes of different hosts always do.
flock(2) is not first come, first served: under constant load one process may get more turns
than another.

A topic's files (its lock and app.taken_log's file) would outlive it: every hold marks the
lock file used (its mtime), and about once every SWEEP_EVERY_S each process removes the files
of topics whose lock nobody has held for STALE_S, taking the lock (without waiting) first.
A process that opened the lock file just before it was removed may hold the removed file's
lock while another holds the new one's: two passes over a topic that nobody had leased from
for a day may then run at once, which costs only lost conditional writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

log = logging.getLogger("duetime.host_locks")

STALE_S = 24 * 3600  # a topic's files unused this long (seconds) are removed
SWEEP_EVERY_S = 3600  # how often (seconds) each process looks for such files
TAKEN_SUFFIX = ".taken"  # app.taken_log's file beside a topic's lock


class HostLocks:
    """Per-key exclusive locks shared by every process of this host that uses `directory`
    (threads of one process exclude each other too). Thread-safe."""

    def __init__(self, directory: Path | None = None, stale_s: float = STALE_S,
                 sweep_every_s: float = SWEEP_EVERY_S) -> None:
        self.directory = directory or (
            Path(tempfile.gettempdir()) / f"duetime-lease-passes-{os.getuid()}")
        self.stale_s = stale_s
        self.sweep_every_s = sweep_every_s
        self._warned = False
        self._swept_at = time.monotonic()  # the first sweep an interval after start
        self._sweeping = threading.Lock()

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        """Hold the key's lock on this host, waiting until it is free (or, if the lock file
        cannot be opened, go on without it)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # a descriptor of its own per hold: flock excludes open file descriptions, and the
            # kernel drops the lock when the descriptor is closed, or its process dies
            fd = os.open(self.directory / str(key), os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("lease passes run without the host lock: %s", exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):  # used now: a sweep leaves its files alone
                os.utime(fd)
            yield
        finally:
            os.close(fd)
        self._sweep_when_due()

    def _sweep_when_due(self) -> None:
        if time.monotonic() - self._swept_at < self.sweep_every_s:
            return
        if not self._sweeping.acquire(blocking=False):
            return
        try:
            self._swept_at = time.monotonic()
            removed = self.sweep()
            if removed:
                log.info("removed the lease-pass files of %d topics unused for %d s",
                         removed, self.stale_s)
        finally:
            self._sweeping.release()

    def sweep(self) -> int:
        """Remove the files of every topic whose lock was last held more than stale_s ago
        and is not held now. Returns how many topics' files were removed."""
        cutoff = time.time() - self.stale_s
        try:
            entries = [e for e in os.scandir(self.directory)
                       if not e.name.endswith(TAKEN_SUFFIX)]
        except OSError:
            return 0
        removed = 0
        for entry in entries:
            try:
                if entry.stat().st_mtime >= cutoff:
                    continue
                fd = os.open(entry.path, os.O_WRONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_mtime < cutoff:  # not held since it was listed
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path + TAKEN_SUFFIX)
                    os.unlink(entry.path)
                    removed += 1
            except OSError:  # held (in use), or already removed by another process
                continue
            finally:
                os.close(fd)
        return removed
