"""`make bench` (frequency caps): what a topic's frequency_cap costs its enqueues and its
hand-outs, against the same topic uncapped in the same run.

In a keyspace of its own (duetime_bench_caps), an API (gunicorn, 2 workers) and a releaser
of its own (so the code measured is this tree's). Two topics alike but for the cap
(`{max: 100, per: day, on_cap: defer}`, never reached: 5 messages a recipient, so every
message is handed out and each pays a claim; and none); for each, in turn, per round:
1. enqueue: N one-message requests (a recipient each of N/5), one client: p50/p99 ms;
2. hand-out: lease `max: 1` then ack, one consumer, until the N are delivered: p50/p99 ms
   of the lease call (the claim is inside it).
The topics alternate over ROUNDS rounds, so a machine's drift touches both alike. Reports
each figure and the capped/uncapped ratios. Writes bench-results/frequency_caps.json.
Usage: python -m tests.bench.frequency_caps [N=400] [ROUNDS=3]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import requests

from app.config import load_config
from app.services import Services
from app.store import migrations
from app.store.session import CassandraSession
from tests.bench.run import percentile, report
from tests.serving import ROOT, start_api, wait_ready

KEYSPACE = "duetime_bench_caps"
PORT = 8099
CAP = {"max": 100, "per": "day", "on_cap": "defer"}


@contextlib.contextmanager
def stack() -> Iterator[tuple[str, dict[str, str]]]:
    """The API and a releaser over KEYSPACE (schema applied); base URL and a key's header."""
    cfg = load_config(keyspace=KEYSPACE)
    db = CassandraSession(cfg)
    migrations.apply(db)
    db.shutdown()
    services = Services(cfg)
    headers = {"Authorization": f"Bearer {services.keys.create('bench-caps')}"}
    services.close()
    env = {**os.environ, "DUETIME_KEYSPACE": KEYSPACE, "DUETIME_HTTP_PORT": str(PORT),
           "DUETIME_WEB_WORKERS": "2", "DUETIME_RATE_LIMIT_PER_S": "0",
           "DUETIME_API_METRICS_PORT": "0", "DUETIME_WAKE_PORT": "0",
           "DUETIME_RELEASER_METRICS_PORT": "0", "DUETIME_RELEASE_RING": "85"}
    api = start_api(env)
    releaser = subprocess.Popen([sys.executable, "-m", "app.cli", "releaser"], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{PORT}"
    try:
        assert wait_ready(base, api), "API did not start"
        yield base, headers
    finally:
        for process in (releaser, api):
            process.terminate()
            process.wait(30)


def _ms(took: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(took, 0.5), 2),  # type: ignore[arg-type]
            "p99_ms": round(percentile(took, 0.99), 2)}  # type: ignore[arg-type]


def one_round(base: str, headers: dict[str, str], topic: str, count: int,
              tag: str) -> tuple[list[float], list[float]]:
    """Enqueue count messages one a request, then lease max 1 + ack them; the ms of each
    enqueue and of each lease call that got a message."""
    session = requests.Session()
    url = f"{base}/v1/topics/{topic}"
    enqueues = []
    for i in range(count):
        began = time.perf_counter()
        answer = session.post(f"{url}/messages", headers=headers, timeout=30, json={
            "payload": {"i": i}, "recipient": f"{tag}-r{i % max(1, count // 5)}"})
        enqueues.append((time.perf_counter() - began) * 1000)
        answer.raise_for_status()
    leases: list[float] = []
    deadline = time.monotonic() + 120
    while len(leases) < count and time.monotonic() < deadline:
        began = time.perf_counter()
        answer = session.post(f"{url}/leases", headers=headers, timeout=30,
                              json={"max": 1, "wait_ms": 1000})
        took = (time.perf_counter() - began) * 1000
        answer.raise_for_status()
        for m in answer.json()["messages"]:
            leases.append(took)
            session.post(f"{url}/messages/{m['id']}/ack", headers=headers, timeout=30,
                         json={"lease_token": m["lease"]["token"]}).raise_for_status()
    if len(leases) < count:
        raise SystemExit(f"{topic}: {len(leases)} of {count} handed out in 120 s")
    return enqueues, leases


def main(count: int, rounds: int) -> dict[str, Any]:
    with stack() as (base, headers):
        topics = {"capped": f"capped{os.getpid()}", "uncapped": f"uncapped{os.getpid()}"}
        for kind, name in topics.items():
            requests.put(f"{base}/v1/topics/{name}", headers=headers, timeout=30, json={
                **({"frequency_cap": CAP} if kind == "capped" else {})}).raise_for_status()
        took: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in topics}
        for n in range(rounds):
            for kind, name in topics.items():
                enqueues, leases = one_round(base, headers, name, count, f"{kind}{n}")
                took[kind][0].extend(enqueues)
                took[kind][1].extend(leases)
    result: dict[str, Any] = {"messages_per_topic": count * rounds, "cap": CAP}
    for kind in topics:
        result[f"{kind}_enqueue"] = _ms(took[kind][0])
        result[f"{kind}_lease_max1"] = _ms(took[kind][1])
    for what in ("enqueue", "lease_max1"):
        for q in ("p50_ms", "p99_ms"):
            result[f"ratio_{what}_{q[:3]}"] = round(
                result[f"capped_{what}"][q] / max(result[f"uncapped_{what}"][q], 0.01), 2)
    return result


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    report("frequency_caps.json", main(*(args + [400, 3][len(args):])))
