"""Fixtures: every test run gets its own keyspace on the real local Cassandra node.

`make test` starts the node (devstack/cassandra.py) before pytest runs; nothing here
imitates Cassandra.
"""

from __future__ import annotations

import faulthandler
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.config import Config, load_config
from app.errors import StoreUnavailable
from app.services import Services
from app.store import migrations
from app.store.session import CassandraSession
from tests.serving import serving
from workers.releaser import Releaser, running_releasers

ROOT = Path(__file__).resolve().parent.parent
# the tests' webhook targets listen on loopback; every process they start inherits this
os.environ.setdefault("DUETIME_WEBHOOK_ALLOW", "127.0.0.0/8,::1")
DEVSTACK = [sys.executable, str(ROOT / "devstack" / "cassandra.py")]

# topics are learned through topic_changes (every 100 ms), not by re-reading them all
FAST = {"release_lease_ms": 2000, "release_rescan_ms": 50,
        "topic_refresh_ms": 600_000}
SUITE_RELEASER = "suite"


def devstack(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run devstack/cassandra.py (start, stop, kill, nodetool ...) and return its output."""
    return subprocess.run([*DEVSTACK, *args], capture_output=True, text=True, check=check)


@contextmanager
def own_keyspace(label: str) -> Iterator[Config]:
    """The config of a new keyspace with the schema applied; dropped afterwards."""
    keyspace = f"duetime_{label}_{os.getpid()}_{secrets.token_hex(3)}"
    cfg = load_config(keyspace=keyspace, rate_limit_per_s=0.0)
    db = CassandraSession(cfg)
    migrations.apply(db)
    db.shutdown()
    try:
        yield cfg
    finally:
        _drop_keyspace(cfg)


@pytest.fixture(autouse=True)
def no_releaser_left_running() -> Iterator[None]:
    """A test that ends (passed or not) with an in-process releaser still running fails,
    and the releaser is stopped: left running, its steps would go on working (and
    logging) through every later test, and past the end of the run."""
    yield
    left = [r for r in running_releasers() if r.member != SUITE_RELEASER]
    for r in left:
        r.stop()
    if left:
        pytest.fail(f"releasers left running: {', '.join(r.member for r in left)}")


# After the run, the interpreter's exit gets this long; a thread still holding it then has its
# stack printed, and the process exits with the run's status, or 1 if the run had passed.
EXIT_GRACE_S = 30.0
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def _exit_anyway() -> None:
    time.sleep(EXIT_GRACE_S)
    left = [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    print(f"\nthe run ended {EXIT_GRACE_S:.0f} s ago and threads still hold the process: "
          f"{', '.join(left)}; every thread's stack:", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit((_exit_status[0] if _exit_status else 0) or 1)


def pytest_unconfigure(config: pytest.Config) -> None:
    """pytest exits by itself: a daemon watchdog outlives the run only if a non-daemon thread
    (a leak a test's fixture missed) keeps the interpreter from exiting; it then names it,
    with its stack, instead of letting it hold the run until CI's limit."""
    threading.Thread(target=_exit_anyway, name="exit-watchdog", daemon=True).start()


@pytest.fixture(scope="session")
def shared_config() -> Iterator[Config]:
    """The keyspace most tests share (tests/releasers/ has one of its own)."""
    with own_keyspace("test") as cfg:
        yield cfg


@pytest.fixture(scope="session")
def config(shared_config: Config) -> Config:
    return shared_config


@pytest.fixture(scope="session", autouse=True)
def suite_releaser(shared_config: Config) -> Iterator[Releaser]:
    """The releaser of the shared keyspace, for the whole run: it serves the pull leases
    (workers.broker) and posts the webhooks of the tests there, as `make up`'s does."""
    services = Services(shared_config.replace(**FAST))
    r = Releaser(services, SUITE_RELEASER)
    r.start()
    yield r
    r.stop()
    services.close()


def _drop_keyspace(cfg: Config, within_s: float = 60.0) -> None:
    """Drop the run's keyspace (waiting for a node that has just been restarted)."""
    deadline = time.monotonic() + within_s
    while True:
        db = CassandraSession(cfg)
        try:
            db.execute_raw(f"DROP KEYSPACE IF EXISTS {cfg.keyspace}", timeout=120)
            return
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
        finally:
            db.shutdown()


@pytest.fixture(scope="session")
def services(config: Config) -> Iterator[Services]:
    svc = Services(config)
    yield svc
    svc.close()


@pytest.fixture()
def app(config: Config) -> Iterator[Flask]:
    application = create_app(config)
    yield application
    application.extensions["duetime"].close()


@pytest.fixture()
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def new_tenant_key(services: Services, prefix: str = "t") -> tuple[str, dict[str, str]]:
    """A fresh tenant and the Authorization header of a new key for it."""
    tenant = f"{prefix}{secrets.token_hex(4)}"
    return tenant, {"Authorization": f"Bearer {services.keys.create(tenant)}"}


@pytest.fixture()
def auth(services: Services) -> dict[str, str]:
    return new_tenant_key(services)[1]


SERVED_PORT = 18083


@pytest.fixture(scope="session")
def served(config: Config) -> Iterator[str]:
    """gunicorn serving the API on SERVED_PORT, on the test keyspace (the client and CLI
    tests); its base URL."""
    with serving(config.keyspace, SERVED_PORT, DUETIME_LOG_FORMAT="text") as base:
        yield base
