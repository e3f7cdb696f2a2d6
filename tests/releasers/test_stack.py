"""`make up` brings the API and a releaser up in the background: /readyz answers 200, a
webhook message sent through the API is pushed by that releaser, and the metrics of both
(the API's added up over its gunicorn workers) count what was done. Both stop again.

The stack under test runs on its own port and on the test run's keyspace, so a user's own
stack (`make up` on 8080) keeps running untouched: its processes, pid files and dev key."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import Config
from app.services import Services
from tests.receiver import Receiver, receiving
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PORT = "18080"
METRICS_PORT = "19464"  # the releaser's
API_METRICS_PORT = "19463"
BASE = f"http://127.0.0.1:{PORT}"


def call(method: str, path: str, key: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        BASE + path, method=method, data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def test_make_up_serves_the_api_and_runs_a_releaser(config: Config) -> None:
    env = {**os.environ, "DUETIME_HTTP_PORT": PORT, "DUETIME_KEYSPACE": config.keyspace,
           "DUETIME_RELEASER_METRICS_PORT": METRICS_PORT,
           "DUETIME_API_METRICS_PORT": API_METRICS_PORT}
    users_key = ROOT / "var" / "dev-key"
    before = users_key.read_text() if users_key.exists() else None
    up = subprocess.run(["make", "up"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert f"{BASE}/" in up.stdout
        assert "dev API key" in up.stdout
        with urllib.request.urlopen(f"{BASE}/readyz", timeout=5) as answer:
            assert answer.status == 200
        services = Services(config)  # the stack's keyspace
        key = services.keys.create("stacktest")
        services.close()
        with receiving(Receiver()) as target:
            call("PUT", "/v1/topics/stack-hooks", key,
                 {"delivery": {"mode": "webhook", "url": target.url}})
            sent = call("POST", "/v1/topics/stack-hooks/messages", key,
                        {"payload": {"hello": "stack"}, "delay_ms": 300})
            assert target.wait_for(lambda got: len(got) == 1, 20)
            assert target.arrivals[0].message_id == sent["id"]
            assert json.loads(target.arrivals[0].body) == {"hello": "stack"}
            for n in range(10):  # spread over the API's workers; due in an hour
                call("POST", "/v1/topics/stack-hooks/messages", key,
                     {"payload": n, "delay_ms": 3_600_000})
        labels = {"tenant": "stacktest", "topic": "stack-hooks"}
        api_metrics = f"http://127.0.0.1:{API_METRICS_PORT}/metrics"
        assert scrape(api_metrics, "duetime_messages_enqueued_total", labels) == 11
        with pytest.raises(urllib.error.HTTPError) as on_api_port:  # tenants reach that one
            urllib.request.urlopen(f"{BASE}/metrics", timeout=5)
        assert on_api_port.value.code == 404
        released = f"http://127.0.0.1:{METRICS_PORT}/metrics"
        assert wait_until(lambda: scrape(released, "duetime_messages_delivered_total",
                                         labels) == 1, 10, every_s=0.1)
        assert scrape(released, "duetime_webhook_attempts_total", {"outcome": "success"}) == 1
        # lag has no topic label, and this releaser also POSTs the retries that earlier
        # tests left in the suite's keyspace: at least this topic's one push
        assert scrape(released, "duetime_delivery_lag_seconds_count", {"mode": "push"}) >= 1
        assert scrape(released, "duetime_release_slots_owned", {}) > 0
        run_quick_start(env, (ROOT / "var" / f"dev-key-{config.keyspace}").read_text().strip())
    finally:
        for name in (f"releaser-{PORT}.pid", f"api-{PORT}.pid"):  # this stack's, no other
            pidfile = ROOT / "var" / "run" / name
            if pidfile.exists():
                os.kill(int(pidfile.read_text()), 15)
                pidfile.unlink()
        (ROOT / "var" / f"dev-key-{config.keyspace}").unlink(missing_ok=True)
    assert (users_key.read_text() if users_key.exists() else None) == before


def scrape(url: str, name: str, labels: dict[str, str]) -> float:
    """One sample of a Prometheus text page (0 when absent); fails unless the page parses."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def quick_start_commands() -> list[str]:
    """The commands of the README's Quick start block, after its `make up`."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- quickstart", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    assert commands[0] == "make up", commands
    return [c for c in commands[1:] if c]


def run_quick_start(env: dict[str, str], key: str) -> None:
    """A newcomer's first minutes, against this stack: every command succeeds and the last
    one shows the message delivered."""
    env = {**env, "DUETIME_URL": BASE, "DUETIME_API_KEY": key}
    output = ""
    for command in quick_start_commands():
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        output = done.stdout
    assert any(line.split()[:2] == ["state", "delivered"] for line in output.splitlines()), output
