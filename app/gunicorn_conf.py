"""gunicorn settings. Threads, not processes alone: long-poll leases hold a request up to 30 s.

The app is loaded in each worker after fork (no preload), so every worker makes its own
Cassandra session on first use: the driver's connections must never cross a fork.
"""

import os
import pathlib
import tempfile
from typing import Any

# Multiprocess metrics (app.metrics): set before any worker imports prometheus_client.
_metrics_dir = pathlib.Path(os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR",
    os.path.join(tempfile.gettempdir(),
                 f"duetime-metrics-{os.environ.get('DUETIME_HTTP_PORT', '8080')}")))

_host = os.environ.get("DUETIME_HTTP_HOST", "127.0.0.1")
bind = f"{_host}:{os.environ.get('DUETIME_HTTP_PORT', '8080')}"
workers = int(os.environ.get("DUETIME_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("DUETIME_WEB_THREADS", "32"))
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


def child_exit(server: Any, worker: Any) -> None:
    """A dead worker's live gauges stop counting (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
