"""gunicorn serving the API as a child process, for tests and the fault suite."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def start_api(env: dict[str, str], output: int | IO[bytes] = subprocess.DEVNULL,
              app: str = "app.wsgi:app") -> subprocess.Popen[bytes]:
    """Start gunicorn with the project's settings and `env` (DUETIME_* of its port and
    keyspace), serving `app` (the API unless told); its output goes to `output`."""
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c",
                             "app/gunicorn_conf.py", app], cwd=ROOT, env=env,
                            stdout=output, stderr=subprocess.STDOUT)


def wait_ready(base: str, process: subprocess.Popen[bytes], within_s: float = 60,
               path: str = "/readyz") -> bool:
    """Whether the server at base answers `path` 200 within within_s (False at once if the
    process has ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def serving(keyspace: str, port: int, **settings: str) -> Iterator[str]:
    """gunicorn with one worker on `port` over `keyspace`, with these DUETIME_* settings,
    ready; its base URL. Stopped on exit."""
    base = f"http://127.0.0.1:{port}"
    # no metrics port unless asked: the default one (9463) belongs to a developer's `make up`
    process = start_api({**os.environ, "DUETIME_HTTP_PORT": str(port),
                         "DUETIME_KEYSPACE": keyspace, "DUETIME_WEB_WORKERS": "1",
                         "DUETIME_API_METRICS_PORT": "0", **settings})
    try:
        assert wait_ready(base, process), "API did not start"
        yield base
    finally:
        process.terminate()
        process.wait(30)
