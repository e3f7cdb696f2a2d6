"""gunicorn settings. Threads, not processes alone: long-poll leases hold a request up to 30 s.

The app is loaded in each worker after fork (no preload), so every worker makes its own
Cassandra session on first use: the driver's connections must never cross a fork.
"""

import contextlib
import gc
import json
import math
import os
import pathlib
import resource
import socket
import tempfile
import threading
import time
from typing import Any

from gunicorn import util
from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import ThreadWorker

# Multiprocess metrics (app.ops.metrics): set before any worker imports prometheus_client.
_metrics_dir = pathlib.Path(os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR",
    os.path.join(tempfile.gettempdir(),
                 f"duetime-metrics-{os.environ.get('DUETIME_HTTP_PORT', '8080')}")))

_host = os.environ.get("DUETIME_HTTP_HOST", "127.0.0.1")
bind = f"{_host}:{os.environ.get('DUETIME_HTTP_PORT', '8080')}"
# the workers' metrics, added up, on a port of their own (app.config.Config.api_metrics_port)
METRICS_PORT = int(os.environ.get("DUETIME_API_METRICS_PORT", "9463"))
_metrics_servers: list[Any] = []
workers = int(os.environ.get("DUETIME_WEB_WORKERS", "2"))
# a request must arrive within CLIENT_TIMEOUT_S of a thread taking it, plus a second per
# MIN_UPLOAD_BYTES_PER_S of it; each write of an answer must progress within CLIENT_TIMEOUT_S
CLIENT_TIMEOUT_S = float(os.environ.get("DUETIME_CLIENT_TIMEOUT_S", "30"))
MIN_UPLOAD_BYTES_PER_S = 64 * 1024


class ClientTooSlow(NoMoreData):
    """The client did not send its request in time: gunicorn closes the connection quietly
    when it happens in the headers, the app answers 408 when it happens in the body
    (app.api.problems), as for any body cut short."""


class _Deadline:
    """A client socket whose reads must all come before a deadline, moved later by every
    byte received at MIN_UPLOAD_BYTES_PER_S: a slow upload of a big batch keeps going, a
    client trickling bytes to hold a thread does not. Every other call goes to the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = math.inf

    def restart(self) -> None:
        self.deadline = time.monotonic() + CLIENT_TIMEOUT_S

    def recv(self, size: int, *flags: int) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ClientTooSlow(f"request not received within {CLIENT_TIMEOUT_S} s")
        self._sock.settimeout(left)
        try:
            data = self._sock.recv(size, *flags)
        except TimeoutError as exc:
            raise ClientTooSlow(f"request not received within {CLIENT_TIMEOUT_S} s") from exc
        self.deadline += len(data) / MIN_UPLOAD_BYTES_PER_S
        return data

    def sendall(self, data: bytes, *flags: int) -> None:
        self._sock.settimeout(CLIENT_TIMEOUT_S)
        self._sock.sendall(data, *flags)

    def send(self, data: bytes, *flags: int) -> int:
        self._sock.settimeout(CLIENT_TIMEOUT_S)
        return self._sock.send(data, *flags)

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        self._sock.settimeout(CLIENT_TIMEOUT_S)
        return self._sock.sendfile(file, offset, count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


QUEUED_HEADER = "X-DUETIME-QUEUED-MS"  # how long the request waited for a thread
_handling = threading.local()


class ClientDeadlineWorker(ThreadWorker):
    """gunicorn's gthread worker, with every client held to _Deadline: slow or stalled
    clients (slowloris) cannot keep the worker's threads. The deadline starts when a thread
    takes the connection for a request, which gthread does once the first bytes are there.
    It also times how long each connection waited in the queue for a thread, which the app
    reads (QUEUED_HEADER, set by pre_request) to shed load (app.ops.shedding)."""

    def enqueue_req(self, conn: Any) -> None:
        conn.queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        if not isinstance(conn.sock, _Deadline):
            conn.sock = _Deadline(conn.sock)
        conn.sock.restart()
        _handling.waited_s = time.monotonic() - getattr(conn, "queued_at", time.monotonic())
        return super().handle(conn)


def pre_request(worker: Any, req: Any) -> None:
    """Tell the app how long this request's connection waited for a thread (the client's
    own header of that name is dropped first: only the worker may say it)."""
    req.headers = [(k, v) for k, v in req.headers if k.upper() != QUEUED_HEADER]
    req.headers.append((QUEUED_HEADER, str(round(getattr(_handling, "waited_s", 0.0) * 1000))))
    _handling.waited_s = 0.0  # a second request on the connection did not wait


def write_problem(sock: Any, status: int, reason: str, detail: str) -> None:
    """gunicorn's own answers (a request line or headers too large: 414, 431; a request it
    cannot parse: 400; an app that fails outside Flask: 500) as problem+json, like the app's
    (app.api.problems), in place of gunicorn's HTML page (util.write_error)."""
    body = json.dumps({
        "type": "https://duetime.dev/problems/" + reason.lower().replace(" ", "-"),
        "title": reason, "status": status, "detail": detail or reason,
    }).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


# the workers' handle_error writes every answer of gunicorn's own through this function
util.write_error = write_problem
worker_class = ClientDeadlineWorker
# threads for short calls, plus one for each long poll the worker may hold (app.delivery.waits):
# the waits can never take the threads health checks, enqueues and acks need. gthread starts
# a thread only when every started one is busy, so an idle worker has few. (Read here, not
# through app.config: importing the app would load prometheus_client before the environment
# above is set, and its values would not be shared.) The default is Config.api_waits.
_waits = int(os.environ.get("DUETIME_API_WAITS") or 1000)
threads = int(os.environ.get("DUETIME_WEB_THREADS", "32")) + _waits
worker_connections = threads + 1000  # open connections a worker takes (idle keep-alives too)
THREAD_STACK_BYTES = 1024 * 1024  # what a thread may use of its stack (memory is touched pages)
preload_app = False
timeout = 60
graceful_timeout = 35
keepalive = 30
accesslog = os.environ.get("DUETIME_ACCESS_LOG") or None
errorlog = "-"


def on_starting(server: Any) -> None:
    """Start the metrics of this API from zero: drop the files of a previous run."""
    _metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in _metrics_dir.glob("*.db"):
        stale.unlink()


def when_ready(server: Any) -> None:
    """Serve every worker's metrics, added up (prometheus_client's multiprocess mode), from
    this master process on METRICS_PORT: operators' scrapers reach it there, tenants, who
    reach the API port, do not (its counters name every tenant's topics). The master serves
    it, so it answers while workers restart, and only the multiprocess files are read."""
    if not METRICS_PORT:
        return
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    try:
        metrics_server, _ = start_http_server(METRICS_PORT, addr=_host, registry=registry)
    except OSError as exc:  # the API serves on; only its metrics are missing, and say why
        server.log.warning("API metrics not served on %s:%d: %s", _host, METRICS_PORT, exc)
        return
    _metrics_servers.append(metrics_server)
    server.log.info("API metrics on http://%s:%d/metrics", _host, METRICS_PORT)


def post_fork(server: Any, worker: Any) -> None:
    """A worker does not keep the master's metrics socket open (it would hold the port). Its
    threads, made after this, reserve THREAD_STACK_BYTES of address space each, not the
    default 8 MiB, and it may open as many files as the host allows (one per connection)."""
    for metrics_server in _metrics_servers:
        metrics_server.socket.close()
    threading.stack_size(THREAD_STACK_BYTES)
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))


def on_exit(server: Any) -> None:
    for metrics_server in _metrics_servers:
        metrics_server.shutdown()
        metrics_server.server_close()


def post_worker_init(worker: Any) -> None:
    """The app is loaded: what the worker made so far (modules, the app, its schemas) lives
    as long as it does, and is kept out of every later garbage collection, which then walks
    only what came since (the full ones stop every thread of the worker)."""
    gc.freeze()


def worker_exit(server: Any, worker: Any) -> None:
    """In a worker that stops (a deploy, a restart, `HUP`, Ctrl-C), after its last request:
    close its services (app.services.Services.close), which closes its connections to the
    releasers and writes its last delivery lag figures."""
    wsgi = getattr(worker, "wsgi", None)  # absent when the app failed to load
    services = getattr(wsgi, "extensions", {}).get("duetime")
    if services is not None:
        services.close()


def child_exit(server: Any, worker: Any) -> None:
    """A dead worker's live gauges stop counting (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
