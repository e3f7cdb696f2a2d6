"""`make bench` (long polls): how many waiting lease calls one API process holds while its
health check and a short call of another tenant stay under 100 ms at p99.

Against the running stack (`make up`, whose releaser serves the keyspace), on an API process
of its own (gunicorn, one worker, on PORT; DUETIME_API_WAITS raised to the largest step):
for each step N, N lease calls (`max: 1`, `wait_ms` WAIT_MS) of TENANTS tenants are sent at
once; once the worker holds them all (its `duetime_lease_waits` gauge), /healthz and an
enqueue of another tenant are timed for PROBE_S (p50/p99/max, ms), with the worker's
threads and resident memory; then every client leaves and the time until the worker holds
none is measured. Reports each step, the most waits held with health p99 < 100 ms, and the
memory a wait costs. Writes bench-results/long_polls.json.
Usage: python -m tests.bench.long_polls [N ...]
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from app.config import load_config
from app.services import Services
from tests.bench.campaigns import _rss_mib
from tests.bench.run import process_tree, report
from tests.raw_http import call, send
from tests.serving import start_api, wait_ready

PORT = 18140
METRICS_PORT = 19465
STEPS = (250, 500, 1000, 2000)
TENANTS = 10
WAIT_MS = 30_000
PROBE_S = 5.0
HEALTH_BAR_MS = 100


def _waiting() -> int:
    text = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("duetime_lease_waits "):
            return int(float(line.split()[1]))
    return 0


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _until(check: Any, within_s: float) -> float | None:
    """Seconds until check() is true, or None past within_s."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


async def _step(n: int, keys: list[dict[str, str]], topics: list[str],
                other: dict[str, str], other_topic: str, worker: int) -> dict[str, Any]:
    rss_before = _rss_mib(worker)
    started = time.monotonic()
    sent = await asyncio.gather(*[
        send(PORT, "POST", f"/v1/topics/{topics[i % TENANTS]}/leases", keys[i % TENANTS],
             {"max": 1, "wait_ms": WAIT_MS}) for i in range(n)])
    held_s = await asyncio.to_thread(_until, lambda: _waiting() >= n, 60)
    held = _waiting()
    health: list[float] = []
    enqueue: list[float] = []
    probe_end = time.monotonic() + PROBE_S
    while time.monotonic() < probe_end:
        health.append((await call(PORT, "GET", "/healthz")).took_s * 1000)
        answer = await call(PORT, "POST", f"/v1/topics/{other_topic}/messages", other,
                            {"payload": 1, "delay_ms": 3_600_000})
        assert answer.status == 201, answer
        enqueue.append(answer.took_s * 1000)
        await asyncio.sleep(0.02)
    threads, rss = _threads(worker), _rss_mib(worker)
    for s in sent:
        s.leave()
    freed_s = await asyncio.to_thread(_until, lambda: _waiting() == 0, 30)

    def ms(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {q: round(ordered[min(len(ordered) - 1, int(len(ordered) * f))], 1)
                for q, f in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}

    return {"waits": n, "held": held, "all_held_s": None if held_s is None else round(held_s, 2),
            "from_first_sent_s": round(time.monotonic() - started, 1),
            "healthz_ms": ms(health), "enqueue_other_tenant_ms": ms(enqueue),
            "worker_threads": threads, "worker_rss_mib": round(rss, 1),
            "rss_per_wait_kib": round((rss - rss_before) * 1024 / n, 1),
            "freed_after_clients_left_s": None if freed_s is None else round(freed_s, 2)}


def main(steps: tuple[int, ...]) -> None:
    config = load_config()
    services = Services(config)
    keys = [{"Authorization": f"Bearer {services.keys.create(f'polls{i}')}"}
            for i in range(TENANTS)]
    other = {"Authorization": f"Bearer {services.keys.create('pollsother')}"}
    services.close()
    env = {**os.environ, "DUETIME_HTTP_PORT": str(PORT), "DUETIME_WEB_WORKERS": "1",
           "DUETIME_API_METRICS_PORT": str(METRICS_PORT),
           "DUETIME_API_WAITS": str(max(steps)), "DUETIME_API_WAITS_PER_TENANT": str(max(steps))}
    api = start_api(env)
    try:
        base = f"http://127.0.0.1:{PORT}"
        assert wait_ready(base, api), "API did not start"
        worker = process_tree(api.pid)[-1]
        topics = []
        for key in keys:
            topic = f"polls{time.monotonic_ns() % 10**9}"
            requests.put(f"{base}/v1/topics/{topic}", headers=key, json={},
                         timeout=30).raise_for_status()
            topics.append(topic)
        other_topic = f"pollsother{time.monotonic_ns() % 10**9}"
        requests.put(f"{base}/v1/topics/{other_topic}", headers=other, json={},
                     timeout=30).raise_for_status()
        results = [asyncio.run(_step(n, keys, topics, other, other_topic, worker))
                   for n in steps]
    finally:
        api.terminate()
        api.wait(30)
    healthy = [r["waits"] for r in results if r["all_held_s"] is not None
               and r["healthz_ms"]["p99"] < HEALTH_BAR_MS
               and r["enqueue_other_tenant_ms"]["p99"] < HEALTH_BAR_MS]
    report("long_polls.json", {
        "steps": results,
        "most_waits_with_health_under_100ms": max(healthy, default=0),
        "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip(),
    })


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or STEPS)
