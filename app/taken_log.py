"""What the lease passes of this host's processes took from a topic, shared through a small
file per topic beside the host lock (app.host_locks), so that what one process keeps
(app.found_due) loses what another took before it tries to take it.

Why: a pass keeps the due messages its timeline read found and left, and the processes of
one host take turns per topic, so with two API workers both keep the same messages. Each
turn then began by losing a conditional write on the message the other process had just
taken: about 0.8 lost writes per message leased one at a time by 2 consumers (`make up`'s
two workers), each a Paxos round for nothing and a round trip more for the call.

The file is a header line (the generation, `%015d`) then one taken id a line. Every call
must be made under the topic's host lock, which is what orders the processes' reads and
appends. A process remembers, per topic, the generation and how far it has read. A write
starts the file over, with the next generation, when it was last written more than QUIET_S
ago or would pass MAX_BYTES. A process that finds another generation than its own cannot
know what it missed: it is told so (None), and drops what it kept, which costs its next
pass a timeline read (after a quiet start-over, only a process that read since the last
write and took nothing can still hold a list: a list lives 200 ms). So a topic's file
holds at most MAX_BYTES, and one leased from now and then a few lines. Nothing depends on
the file for correctness (the conditional write decides, as between hosts), so when it
cannot be used the waste comes back, with one warning. A pass that leases nothing (an idle
long poll) reads and writes no file once its process follows the topic's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import TypeVar

from app.host_locks import TAKEN_SUFFIX

log = logging.getLogger("duetime.taken_log")
Result = TypeVar("Result")

MAX_BYTES = 16 * 1024  # about 500 server-made ids
QUIET_S = 1.0  # longer than a kept list lives (app.found_due.KEEP_MS)
HEADER_BYTES = 16  # b"%015d\n"
MAX_TOPICS = 10_000  # topics whose read position is remembered


class TakenLog:
    """Thread-safe; one per process. Calls on one topic must hold its host lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._read: dict[Hashable, tuple[int, int]] = {}  # topic: (generation, read up to)
        self._lock = threading.Lock()
        self._warned = False

    def taken_elsewhere(self, key: Hashable) -> set[str] | None:
        """The ids other processes recorded for the topic since this one last read or
        recorded; None when that is not known (never read, or started over since). When
        the file cannot be used, none: each process then keeps its list as if alone."""
        def read(fd: int) -> set[str] | None:
            generation, size = self._generation(fd), os.fstat(fd).st_size
            with self._lock:
                seen = self._read.get(key)
            self._remember(key, generation, size)
            if seen is None or seen[0] != generation or seen[1] > size:
                return None
            new = os.pread(fd, size - seen[1], seen[1]) if size > seen[1] else b""
            return set(new.decode().split())

        nothing: set[str] | None = set()
        return self._with_file(key, read, nothing)

    def follow(self, key: Hashable) -> None:
        """Start following the topic's file from its end, unless this process already does
        (a position behind the end only makes the next read longer)."""
        with self._lock:
            if key in self._read:
                return
        self._with_file(key, lambda fd: self._remember(
            key, self._generation(fd), os.fstat(fd).st_size), None)

    def record(self, key: Hashable, ids: Iterable[str]) -> None:
        """Append the ids this process took, and count the file as read to its end (call
        taken_elsewhere first: what others appended before is skipped)."""
        lines = "".join(f"{message_id}\n" for message_id in ids).encode()

        def append(fd: int) -> None:
            generation, stat = self._generation(fd), os.fstat(fd)
            size = stat.st_size
            if (size + len(lines) > MAX_BYTES
                    or (size > HEADER_BYTES and time.time() - stat.st_mtime > QUIET_S)):
                generation, size = generation + 1, HEADER_BYTES
                os.ftruncate(fd, 0)
                os.pwrite(fd, b"%015d\n" % generation, 0)
            if lines:
                os.pwrite(fd, lines, size)
            self._remember(key, generation, size + len(lines))

        self._with_file(key, append, None)

    def _with_file(self, key: Hashable, work: Callable[[int], Result],
                   failed: Result) -> Result:
        """work(descriptor of the topic's file, with its header); `failed` when the file
        cannot be opened or used (warned once)."""
        fd = -1
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / f"{key}{TAKEN_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(fd).st_size < HEADER_BYTES:
                os.pwrite(fd, b"%015d\n" % 0, 0)
            return work(fd)
        except (OSError, ValueError) as exc:
            self._warn(exc)
            return failed
        finally:
            if fd >= 0:
                os.close(fd)

    @staticmethod
    def _generation(fd: int) -> int:
        """The header's number (ValueError when it is not one)."""
        return int(os.pread(fd, HEADER_BYTES, 0))

    def _remember(self, key: Hashable, generation: int, offset: int) -> None:
        with self._lock:
            self._read.pop(key, None)  # so the dict's order is the order of use
            self._read[key] = (generation, offset)
            while len(self._read) > MAX_TOPICS:
                del self._read[next(iter(self._read))]

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("kept lease lists are not shared between this host's processes: %s",
                        exc)
