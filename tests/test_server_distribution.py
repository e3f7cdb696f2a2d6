"""The server distribution as an operator installs it: its wheel (tests.distributions) in a
clean virtualenv outside the project applies the schema to a fresh keyspace from the
migrations it carries, makes a key and runs a releaser (`duetime-admin`); the client's
wheel, in a virtualenv of its own with no server package, enqueues, leases and acks through
an API served on that keyspace."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Config
from app.store import migrations
from tests.conftest import _drop_keyspace
from tests.distributions import client_venv, server_venv
from tests.serving import serving

__all__ = ["client_venv", "server_venv"]  # the fixtures, imported for these tests
pytestmark = pytest.mark.packaging

CLIENT_SCRIPT = """
import json, sys
from duetime_client import Client
with Client(sys.argv[1], sys.argv[2]) as api:
    api.enqueue("wheel", {"n": 2}, id="w-2")
    leased = api.lease("wheel", 10, wait_ms=10_000)
    for message in leased:
        api.ack("wheel", message)
    print(json.dumps({"leased": [m["id"] for m in leased],
                      "state": api.get("wheel", "w-2")["state"]}))
"""


@pytest.fixture()
def fresh(config: Config) -> Iterator[Config]:
    """A keyspace no migration has touched; dropped afterwards."""
    keyspace = f"duetime_wheel_{os.getpid()}_{secrets.token_hex(3)}"
    yield config.replace(keyspace=keyspace)
    _drop_keyspace(config.replace(keyspace=keyspace))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_installed_server_and_client_work_from_a_fresh_keyspace(
        server_venv: Path, client_venv: Path, fresh: Config, tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "DUETIME_KEYSPACE": fresh.keyspace, "DUETIME_RELEASER_METRICS_PORT": "0",
           "DUETIME_LOG_FORMAT": "text"}

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(server_venv / "duetime-admin"), *args], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    applied = admin("schema", "apply")
    assert applied.returncode == 0, applied.stderr
    count = len(migrations.discover())
    assert f"({count} applied now)" in applied.stdout and "applied 001_tenancy" in applied.stdout
    assert admin("schema", "status").stdout.strip() == "schema current"
    made = admin("keys", "create", "--tenant", "wheel")
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[-1]

    releaser = subprocess.Popen(
        [str(server_venv / "duetime-admin"), "releaser", "--member", f"wheel-{os.getpid()}"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with serving(fresh.keyspace, _free_port()) as base:
            def duetime(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([str(client_venv / "duetime"), *args, "--url", base,
                                       "--key", key], cwd=tmp_path, capture_output=True,
                                      text=True, timeout=120)

            assert duetime("topics", "wheel", "--lease-seconds", "30").returncode == 0
            sent = duetime("enqueue", "wheel", '{"n": 1}', "--id", "w-1")
            assert sent.returncode == 0, sent.stderr
            tailed = duetime("tail", "wheel", "--count", "1", "--json")  # leases, acks
            assert tailed.returncode == 0, tailed.stderr
            assert json.loads(tailed.stdout)["id"] == "w-1"
            got = duetime("get", "wheel", "w-1", "--json")
            assert json.loads(got.stdout)["state"] == "delivered"
            through = subprocess.run([str(client_venv / "python"), "-c", CLIENT_SCRIPT, base,
                                      key], cwd=tmp_path, capture_output=True, text=True,
                                     timeout=120)
            assert through.returncode == 0, through.stderr
            assert json.loads(through.stdout) == {"leased": ["w-2"], "state": "delivered"}
    finally:
        releaser.terminate()
        releaser.wait(60)
    no_server = subprocess.run([str(client_venv / "python"), "-c", "import app"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert no_server.returncode == 1 and "No module named 'app'" in no_server.stderr
