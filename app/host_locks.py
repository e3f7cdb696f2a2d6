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
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from collections.abc import Hashable, Iterator
from pathlib import Path

log = logging.getLogger("duetime.host_locks")


class HostLocks:
    """Per-key exclusive locks shared by every process of this host that uses `directory`
    (threads of one process exclude each other too). Thread-safe."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or (
            Path(tempfile.gettempdir()) / f"duetime-lease-passes-{os.getuid()}")
        self._warned = False

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
            yield
        finally:
            os.close(fd)
