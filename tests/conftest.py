"""Fixtures: every test run gets its own keyspace on the real local Cassandra node.

`make test` starts the node (devstack/cassandra.py) before pytest runs; nothing here
imitates Cassandra.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parent.parent
# the tests' webhook targets listen on loopback; every process they start inherits this
os.environ.setdefault("DUETIME_WEBHOOK_ALLOW", "127.0.0.0/8,::1")
DEVSTACK = [sys.executable, str(ROOT / "devstack" / "cassandra.py")]


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


@pytest.fixture(scope="session")
def config() -> Iterator[Config]:
    with own_keyspace("test") as cfg:
        yield cfg


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
