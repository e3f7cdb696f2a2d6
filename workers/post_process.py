"""The releaser's POST process: a child process that sends each webhook POST it is given (taken
at its due time: never before it) and reports what became of it.

Why a process of its own: the releaser's Cassandra work (takes, scans, outcomes) keeps its
interpreter busy, and a thread waiting for the GIL waits up to Python's switch interval after
every socket call. Timers of an event loop sharing that interpreter fired tens to hundreds of
milliseconds late. In a child process the loop has an interpreter to itself.

Protocol over one duplex pipe (multiprocessing, spawn context):
- parent → child: lists of PostJob; None asks the child to finish every job it was given
  (each at its due time) and exit;
- child → parent: lists of PostResult, then None once it has finished after a None.
A job's POST never starts before due_ms (wall clock of this host), nor after start_by_ms
(its lease would run out mid-POST): such a job is answered with posted=False.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from app.delivery.webhook_targets import parse_allow
from workers.http_client import AsyncHttpClient
from workers.loop import PrioritySlots, new_loop
from workers.webhook import post_outcome

RESULT_FLUSH_S = 0.002  # results are sent in batches at most this old
RESTART_MIN_S = 1.0  # a child that died sooner than this after its start is restarted after this
log = logging.getLogger("duetime.releaser")


@dataclasses.dataclass(frozen=True)
class PostJob:
    """One POST, ready to send: everything the child needs, nothing it must look up."""

    ref: int  # the parent's handle for this job
    topic: str  # topic uid: concurrency is per topic
    concurrency: int  # the topic's webhook concurrency (POSTs in flight at most)
    due_ms: int  # epoch ms; never sent before
    start_by_ms: int  # epoch ms; not started after (the lease would expire mid-POST)
    priority: int  # lower first among jobs waiting for a slot
    group: str | None  # fair-delivery group: groups take turns for slots (app.delivery.fairness)
    url: str
    headers: dict[str, str]
    body: bytes
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class PostResult:
    ref: int
    posted: bool  # False: not started, its start_by_ms had passed
    error: str | None  # None: the target answered 2xx
    started_ms: int = 0  # epoch ms the POST started (posted only)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Sender:
    """The child's side, on its event loop. Messages on the pipe are framed as
    multiprocessing.Connection frames them (the parent uses one): a 4-byte big-endian length
    (-1, then an 8-byte length, past 2 GiB), then the pickle."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 loop: asyncio.AbstractEventLoop, allow: str) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = loop
        self.client = AsyncHttpClient(parse_allow(allow))
        self.slots: dict[str, PrioritySlots] = {}
        self.jobs = 0  # received, result not yet sent
        self.finishing = False
        self.results: list[PostResult] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def receive(self) -> None:
        """Read job lists until the parent asks to finish (None) or is gone."""
        while True:
            try:
                (size,) = struct.unpack("!i", await self.reader.readexactly(4))
                if size == -1:
                    (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
                jobs: list[PostJob] | None = pickle.loads(await self.reader.readexactly(size))
            except (asyncio.IncompleteReadError, ConnectionError):
                self.loop.stop()  # the parent is gone: nobody to report to
                return
            if jobs is None:
                self.finishing = True
                self._maybe_exit()
                return
            self.jobs += len(jobs)
            for job in jobs:
                self._at(job)

    def _at(self, job: PostJob) -> None:
        wait_ms = job.due_ms - _now_ms()
        if wait_ms > 0:  # the loop's timer may fire a fraction of a ms early: check again
            self.loop.call_later(wait_ms / 1000, self._at, job)
            return
        self._keep(self.loop.create_task(self._post(job)))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.tasks.discard)

    async def _post(self, job: PostJob) -> None:
        slots = self.slots.get(job.topic)
        if slots is None:
            slots = self.slots[job.topic] = PrioritySlots(job.concurrency)
        await slots.acquire(job.priority, job.due_ms, job.group)
        try:
            if _now_ms() > job.start_by_ms:
                result = PostResult(job.ref, False, None)
            else:
                started = _now_ms()
                try:
                    error = await post_outcome(self.client, job.url, job.headers, job.body,
                                               job.timeout_s)
                except Exception as exc:  # an outcome, whatever happened: never a lost job
                    error = f"{type(exc).__name__}: {exc}"
                result = PostResult(job.ref, True, error, started)
        finally:
            slots.release()
        self._report(result)

    def _report(self, result: PostResult) -> None:
        if not self.results:
            self.loop.call_later(RESULT_FLUSH_S, self._flush)
        self.results.append(result)

    def _flush(self) -> None:
        results, self.results = self.results, []
        self._send(results)
        self.jobs -= len(results)
        self._maybe_exit()

    def _send(self, message: list[PostResult] | None) -> None:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        self.writer.write(struct.pack("!i", len(data)) + data)  # buffered: never blocks

    def _maybe_exit(self) -> None:
        if self.finishing and self.jobs == 0 and not self.results:
            self.client.close()
            self._send(None)
            self._keep(self.loop.create_task(self._close()))

    async def _close(self) -> None:
        await self.writer.drain()
        self.writer.close()
        self.loop.stop()


def serve(conn: Connection, allow: str = "") -> None:
    """The child's main: run the sender until the parent asks it to finish (or is gone).
    allow: the networks webhooks may reach although not public (DUETIME_WEBHOOK_ALLOW)."""
    loop = new_loop()
    asyncio.set_event_loop(loop)
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()

    async def start() -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        sender = _Sender(reader, writer, loop, allow)
        sender._keep(loop.create_task(sender.receive()))

    loop.run_until_complete(start())
    loop.run_forever()


class PostProcess:
    """The parent's side: start the child, send it jobs (thread-safe), receive results on a
    reader thread (passed to on_results). If the child dies, on_lost gets the refs it held
    and a new child is started."""

    def __init__(self, on_results: Callable[[list[PostResult]], None],
                 on_lost: Callable[[list[int]], None], allow: str = "") -> None:
        self.on_results = on_results
        self.on_lost = on_lost
        self.allow = allow
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._stopping = False
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._start_child()

    def _start_child(self) -> None:
        self._started = time.monotonic()
        self._conn, child_end = self._context.Pipe()
        self._child = self._context.Process(target=serve, args=(child_end, self.allow),
                                            daemon=True, name="duetime-post")
        self._child.start()
        child_end.close()
        self._reader = threading.Thread(target=self._read_loop, args=(self._conn,),
                                        name="post-results", daemon=True)
        self._reader.start()

    def send(self, jobs: list[PostJob]) -> None:
        """Hand jobs to the child. If it has just died, they are held like the jobs it had:
        the reader thread reports them all to on_lost."""
        with self._lock:
            self._held.update(j.ref for j in jobs)
            with contextlib.suppress(OSError):
                self._conn.send(jobs)

    def _read_loop(self, conn: Connection) -> None:
        while True:
            try:
                results: list[PostResult] | None = conn.recv()
            except (EOFError, OSError):
                self._child_lost()
                return
            if results is None:
                return  # finished, as asked by stop()
            with self._lock:
                self._held.difference_update(r.ref for r in results)
            self.on_results(results)

    def _child_lost(self) -> None:
        self._child.join(1)
        log.error("the POST process exited (code %s); the POSTs it held will come due again "
                  "when their leases expire", self._child.exitcode)
        if time.monotonic() - self._started < RESTART_MIN_S:
            time.sleep(RESTART_MIN_S)  # a child that cannot run must not restart in a loop
        with self._lock:  # one section: no job may go to the dead child unreported
            lost, self._held = list(self._held), set()
            if not self._stopping:
                self._start_child()
        self.on_lost(lost)

    def stop(self) -> None:
        """Let the child POST what it holds (each at its due time), then stop it."""
        with self._lock:
            self._stopping = True
            with contextlib.suppress(OSError):  # the child is already gone
                self._conn.send(None)
        self._reader.join()
        self._child.join(10)
        if self._child.is_alive():
            self._child.kill()
