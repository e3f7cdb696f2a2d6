"""The client distribution (clients/python, `duetime-client`) built into a wheel and installed
alone into an empty virtualenv (tests.distributions): it brings none of the server's
packages, its `duetime` command talks to a served stack and points the operator's commands
to the server's `duetime-admin`, and the client's own tests (clients/python/tests) pass
there against the served API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.services import Services
from tests.conftest import ROOT, new_tenant_key
from tests.distributions import CLIENT_SOURCE, client_venv

__all__ = ["client_venv"]  # the fixture, imported for these tests
SERVER_PACKAGES = ("flask", "cassandra-driver", "gunicorn", "marshmallow", "apscheduler",
                   "duetime")


def _installed(bin_dir: Path) -> set[str]:
    listed = subprocess.run([str(bin_dir / "pip"), "list", "--format=json"], check=True,
                            capture_output=True, text=True, timeout=60).stdout
    return {p["name"].lower() for p in json.loads(listed)}


def test_the_client_installs_without_the_server(client_venv: Path, tmp_path: Path) -> None:
    installed = _installed(client_venv)
    assert {"duetime-client", "urllib3"} <= installed, installed
    assert not installed & set(SERVER_PACKAGES), installed & set(SERVER_PACKAGES)
    # importing the client loads no server module even where one could be found
    loaded = subprocess.run(
        [str(client_venv / "python"), "-c",
         "import sys, duetime_client, duetime_client.cli; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('app', 'workers', 'spark', 'flask', 'cassandra')))"],
        check=True, capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout
    assert loaded.strip() == "[]", loaded
    server = subprocess.run([str(client_venv / "python"), "-c", "import app"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert server.returncode == 1 and "No module named 'app'" in server.stderr


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


def test_operator_commands_point_to_the_server_command(client_venv: Path,
                                                       tmp_path: Path) -> None:
    """Asked for an operator command, the client's `duetime` imports nothing (not even a
    package named `app` beside it) and names `duetime-admin`."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("raise SystemExit('imported app')\n")
    (tmp_path / "app" / "cli.py").write_text("raise SystemExit('imported app.cli')\n")
    helped = subprocess.run([str(client_venv / "duetime"), "--help"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert helped.returncode == 0 and "enqueue" in helped.stdout
    assert "duetime-admin schema" in helped.stdout
    for command in ("schema", "keys", "openapi", "releaser", "spark"):
        refused = subprocess.run([str(client_venv / "duetime"), command, "apply"],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                 env={**os.environ, "PYTHONPATH": str(tmp_path)})
        assert refused.returncode == 2, refused.stderr
        assert f"duetime-admin {command}" in refused.stderr and "imported" not in (
            refused.stderr + refused.stdout)


def test_the_clients_own_tests_pass_in_its_venv(client_venv: Path, served: str,
                                                services: Services) -> None:
    """clients/python/tests, run by the client venv's pytest: what they import is the
    installed client and the standard library only."""
    _, headers = new_tenant_key(services)
    done = subprocess.run(
        [str(client_venv / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests"], cwd=CLIENT_SOURCE, capture_output=True, text=True, timeout=600,
        env={"PATH": f"{client_venv}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
             "DUETIME_TEST_URL": served,
             "DUETIME_TEST_KEY": headers["Authorization"].split()[1]})
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout


def test_the_project_venv_has_both_commands() -> None:
    """In the project's venv (server and client together) `duetime-admin` runs the operator
    commands, with no API or node."""
    done = subprocess.run([str(Path(sys.executable).parent / "duetime-admin"), "openapi",
                           "--output", "-"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT,
                          env={"DUETIME_CASSANDRA_PORT": "9999", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "\nopenapi: 3.1.0\n" in done.stdout and "/v1/topics/{topic}/leases" in done.stdout
