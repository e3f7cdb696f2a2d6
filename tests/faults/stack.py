"""The stack a fault run works on: gunicorn with its workers and two releasers, as processes
of their own on the tests' `solo` node (devstack/cassandra.py, port 9044), or on the local
3-node cluster (c1-c3 on 127.0.0.1-3, port 9043, RF=3 at QUORUM/SERIAL), so a nemesis can
kill, pause or restart any of them, a node included, without touching a user's stack or the
dev node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.config import Config, load_config
from app.errors import StoreUnavailable
from app.services import Services
from app.store import migrations
from tests.serving import start_api, wait_ready

ROOT = Path(__file__).resolve().parents[2]
DEVSTACK = [sys.executable, str(ROOT / "devstack" / "cassandra.py")]
NODE = "solo"
CQL_PORT = 9044
CLUSTER_NODES = ("c1", "c2", "c3")
CLUSTER_PORT = 9043
CLUSTER_SETTINGS = {  # what a production cluster runs with, in one datacenter
    "DUETIME_CONTACT_POINTS": "127.0.0.1,127.0.0.2,127.0.0.3",
    "DUETIME_CQL_PORT": str(CLUSTER_PORT),
    "DUETIME_REPLICATION": "{'class': 'SimpleStrategy', 'replication_factor': 3}",
    "DUETIME_CONSISTENCY": "QUORUM", "DUETIME_SERIAL_CONSISTENCY": "SERIAL",
}
LEASE_MS = 3000  # the releasers' slot leases: a pause past it costs seconds, not minutes


def devstack(*args: str) -> None:
    subprocess.run([*DEVSTACK, *args], check=True, capture_output=True, text=True)


class FaultStack:
    """Start with start(), stop with stop(); every process is a child of this one."""

    def __init__(self, port: int = 18090, keyspace: str = "duetime_faults",
                 cluster: bool = False) -> None:
        self.port = port
        self.keyspace = keyspace
        self.cluster = cluster
        self.nodes = CLUSTER_NODES if cluster else (NODE,)
        self.url = f"http://127.0.0.1:{port}"
        self.run_dir = Path(tempfile.mkdtemp(prefix="duetime-faults-"))
        self.api: subprocess.Popen[bytes] | None = None
        self.releasers: dict[str, subprocess.Popen[bytes]] = {}
        self.key = ""

    def settings(self) -> dict[str, str]:
        """The Cassandra settings of this stack's processes."""
        return CLUSTER_SETTINGS if self.cluster else {"DUETIME_CQL_PORT": str(CQL_PORT)}

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DUETIME_KEYSPACE": self.keyspace, **self.settings(),
                "DUETIME_HTTP_PORT": str(self.port),
                "DUETIME_WEB_WORKERS": "2", "DUETIME_RELEASER_METRICS_PORT": "0",
                "DUETIME_RELEASE_LEASE_MS": str(LEASE_MS), "DUETIME_LOG_FORMAT": "text",
                "DUETIME_WEBHOOK_ALLOW": "127.0.0.0/8,::1", "DUETIME_RATE_LIMIT_PER_S": "0",
                "PROMETHEUS_MULTIPROC_DIR": str(self.run_dir / "metrics"), **extra}

    def start(self) -> None:
        devstack("start", "cluster" if self.cluster else NODE)
        services = Services(self.config())
        migrations.apply(services.db)
        self.key = services.keys.create("faults")
        services.close()
        self.start_api()
        for member in ("faults-r1", "faults-r2"):
            self.start_releaser(member)

    def _log(self, name: str) -> int:
        return os.open(self.run_dir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def start_api(self, **extra: str) -> None:
        self.api = start_api(self.env(**extra), self._log("api"))
        if not wait_ready(self.url, self.api):
            raise RuntimeError(f"the fault stack's API did not get ready; see {self.run_dir}")

    def start_releaser(self, member: str, **extra: str) -> None:
        self.releasers[member] = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "releaser", "--member", member], cwd=ROOT,
            env=self.env(**extra), stdout=self._log(member), stderr=subprocess.STDOUT)

    def api_workers(self) -> list[int]:
        assert self.api is not None
        return children(self.api.pid)

    def post_processes(self, member: str) -> list[int]:
        """The webhook POST process(es) a releaser started (workers/post_process.py)."""
        return children(self.releasers[member].pid)

    def kill_releaser(self, member: str) -> None:
        """SIGKILL a releaser and its POST process (which would otherwise outlive it)."""
        process = self.releasers.pop(member)
        for child in children(process.pid):
            _signal(child, signal.SIGKILL)
        process.kill()
        process.wait()

    def stop(self) -> None:
        for member in list(self.releasers):
            process = self.releasers.pop(member)
            _signal(process.pid, signal.SIGCONT)
            process.terminate()
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.api is not None:
            self.api.terminate()
            try:
                self.api.wait(40)
            except subprocess.TimeoutExpired:
                self.api.kill()
            self.api = None
        services = Services(self.config())
        try:
            self._drop_keyspace(services)
        finally:
            services.close()
            devstack("stop", "cluster" if self.cluster else NODE)

    def _drop_keyspace(self, services: Services, attempts: int = 3) -> None:
        """Clean-up, not a promise under test: after a nemesis a node's connection may still
        be defunct (a DROP timed out so on the cluster once), so try again, then leave the
        keyspace to the next run's disk and say so."""
        for attempt in range(1, attempts + 1):
            try:
                services.db.execute_raw(f"DROP KEYSPACE IF EXISTS {self.keyspace}", timeout=120)
                return
            except StoreUnavailable as exc:
                print(f"dropping {self.keyspace} failed ({exc}), attempt {attempt} of {attempts}",
                      flush=True)
                time.sleep(5)

    def config(self) -> Config:
        return load_config({**self.settings(), "DUETIME_KEYSPACE": self.keyspace})


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
