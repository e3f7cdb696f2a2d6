"""gunicorn settings. Threads, not processes alone: long-poll leases hold a request up to 30 s.

The app is loaded in each worker after fork (no preload), so every worker makes its own
Cassandra session on first use: the driver's connections must never cross a fork.
"""

import os

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
