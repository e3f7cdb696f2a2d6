"""The client distribution (clients/python, `duetime-client`) installed alone into an empty
virtualenv: it brings none of the server's packages, and its `duetime` command talks to a
served stack and refuses the operator commands it cannot run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services import Services
from tests.conftest import new_tenant_key

CLIENT_SOURCE = Path(__file__).resolve().parent.parent / "clients" / "python"
SERVER_PACKAGES = ("flask", "cassandra-driver", "gunicorn", "marshmallow", "apscheduler",
                   "duetime")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty virtualenv with `pip install clients/python` (a copy, so the build leaves
    nothing in the project); its bin directory."""
    root = tmp_path_factory.mktemp("client-venv")
    source = root / "source"
    shutil.copytree(CLIENT_SOURCE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(source)], check=True,
                   timeout=600)
    yield bin_dir


def _installed(bin_dir: Path) -> set[str]:
    listed = subprocess.run([str(bin_dir / "pip"), "list", "--format=json"], check=True,
                            capture_output=True, text=True, timeout=60).stdout
    return {p["name"].lower() for p in json.loads(listed)}


def test_the_client_installs_without_the_server(client_venv: Path) -> None:
    installed = _installed(client_venv)
    assert {"duetime-client", "urllib3"} <= installed, installed
    assert not installed & set(SERVER_PACKAGES), installed & set(SERVER_PACKAGES)
    # importing the client loads no server module even where one could be found
    loaded = subprocess.run(
        [str(client_venv / "python"), "-c",
         "import sys, duetime_client, duetime_client.cli; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('app', 'workers', 'spark', 'flask', 'cassandra')))"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    assert loaded.strip() == "[]", loaded


def test_the_installed_cli_talks_to_a_served_stack(
        client_venv: Path, served: str, services: Services) -> None:
    _, headers = new_tenant_key(services)
    key = headers["Authorization"].split()[1]

    def duetime(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(client_venv / "duetime"), *args, "--url", served,
                               "--key", key], capture_output=True, text=True, timeout=60)

    made = duetime("topics", "reminders", "--set", "lease_seconds=30", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["lease_seconds"] == 30
    sent = duetime("enqueue", "reminders", '{"user": 42}', "--id", "r-1", "--delay-ms",
                   "600000", "--json")
    assert sent.returncode == 0 and json.loads(sent.stdout)["id"] == "r-1", sent.stderr
    counted = duetime("stats", "reminders", "--json")
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)["counts"]["scheduled"] == 1
    missing = duetime("get", "reminders", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error 404")


def test_operator_commands_need_the_server_package(client_venv: Path) -> None:
    helped = subprocess.run([str(client_venv / "duetime"), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "enqueue" in helped.stdout and "schema" in helped.stdout
    refused = subprocess.run([str(client_venv / "duetime"), "schema", "apply"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "server package" in refused.stderr, refused.stderr


def test_the_project_venv_runs_operator_commands_through_the_same_command() -> None:
    """In the project's venv (server and client together) `duetime` reaches app.cli."""
    done = subprocess.run([str(Path(sys.executable).parent / "duetime"), "openapi",
                           "--output", "-"], capture_output=True, text=True, timeout=120,
                          env={"DUETIME_CASSANDRA_PORT": "9999", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "\nopenapi: 3.1.0\n" in done.stdout and "/v1/topics/{topic}/leases" in done.stdout
