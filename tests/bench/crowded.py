"""`make bench` (a crowded keyspace): is push on time while many webhook targets are down?

Against the running stack (`make up`):
1. T topics (default 400): every third a webhook topic whose target refuses connections,
   with 3 messages due now and retried every 1 to 4 s (max_attempts 1000), the others pull
   topics with 3 messages nobody leases; 10 s for their retries to start;
2. the stack's releaser is stopped and started again (from this tree): it starts in a
   keyspace where about a hundred messages a second fail and come due again;
3. a webhook topic made before the restart gets 30 messages due 1 to 30 s after it, and
   every 2.5 s a webhook topic is created with one message due 200 ms after: the lag of
   each at a local receiver (arrival - deliver_at), p50/p99/max, none early;
4. the releaser's cores over that minute, and its step durations (its /metrics); each
   message 100 ms late or more, with its due time after the restart;
5. every topic made is deleted (their retries stop).
Writes bench-results/crowded.json and prints a table. Usage:
python -m tests.bench.crowded [T]
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import requests

from app.core.timeparse import parse_instant
from tests.bench.run import (
    OUT,
    ROOT,
    URL,
    cpu_s,
    dev_headers,
    percentile,
    releaser_pid,
    timed_threads,
)
from tests.receiver import Receiver, receiving

THREADS = 8
GONE = "http://127.0.0.1:9/gone"  # the discard port: nothing listens, connections are refused
NEW_TOPICS = 12
NEW_EVERY_S = 2.5
LIVE_MESSAGES = 30
METRICS = "http://127.0.0.1:9464/metrics"
LATE_MS = 100  # a message this late or later is listed, with its due time after the restart


def make_crowd(headers: dict[str, str], count: int, run: str) -> list[str]:
    """count topics, each with 3 messages due now; every third a webhook topic whose
    target is gone (its messages retried every 1 to 4 s)."""
    names = [f"crowd{run}{n}" for n in range(count)]

    def work(mine: list[int]) -> None:
        session = requests.Session()
        for n in mine:
            body: dict[str, Any] = {}
            if n % 3 == 0:
                body = {"delivery": {"mode": "webhook", "url": GONE}, "max_attempts": 1000,
                        "retry": {"backoff_seconds": 1, "max_backoff_seconds": 4}}
            session.put(f"{URL}/v1/topics/{names[n]}", headers=headers, json=body,
                        timeout=60).raise_for_status()
            session.post(f"{URL}/v1/topics/{names[n]}/messages:batch", headers=headers,
                         timeout=60, json={"messages": [{"payload": k} for k in range(3)]}
                         ).raise_for_status()

    timed_threads([functools.partial(work, list(range(k, count, THREADS)))
                   for k in range(THREADS)])
    return names


def restart_releaser() -> int:
    """Stop the stack's releaser and start one from this tree in its place; its pid."""
    pid = releaser_pid()
    os.kill(pid, 15)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    port = os.environ.get("DUETIME_HTTP_PORT", "8080")
    env = {"DUETIME_WEBHOOK_ALLOW": "127.0.0.0/8,::1", "DUETIME_LOG_FORMAT": "text",
           **os.environ}  # as `make up` starts it: the receiver is local
    with (ROOT / "var/log/releaser.log").open("a") as log:
        started = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "releaser", "--member", f"crowded-{port}"],
            cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    (ROOT / f"var/run/releaser-{port}.pid").write_text(str(started.pid))
    return started.pid


def step_seconds() -> dict[str, dict[str, float]]:
    """Per releaser step: runs and mean seconds a run, from its /metrics."""
    text = requests.get(METRICS, timeout=10).text
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        for part in ("_count", "_sum"):
            prefix = f"duetime_releaser_step_duration_seconds{part}{{step=\""
            if line.startswith(prefix):
                step = line[len(prefix):].split('"', 1)[0]
                found.setdefault(step, {})[part] = float(line.rsplit(" ", 1)[1])
    return {step: {"runs": v.get("_count", 0),
                   "mean_s": round(v.get("_sum", 0) / max(1.0, v.get("_count", 0)), 3)}
            for step, v in found.items()}


def _lags(summary: list[int | None]) -> dict[str, float]:
    got = [lag for lag in summary if lag is not None]
    return {"p50": percentile(got, 0.5), "p99": percentile(got, 0.99),
            "max": max(got, default=0), "early": sum(1 for x in got if x < 0),
            "delivered": len(got), "of": len(summary)}


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 400
    headers = dev_headers()
    run = uuid.uuid4().hex[:4]
    made = make_crowd(headers, count, run)
    time.sleep(10)  # their first attempts fail, their retries begin
    session = requests.Session()
    with receiving(Receiver()) as target:
        live = f"live{run}"
        session.put(f"{URL}/v1/topics/{live}", headers=headers, timeout=60, json={
            "delivery": {"mode": "webhook", "url": target.url}}).raise_for_status()
        made.append(live)
        pid = restart_releaser()
        started, cpu_before = time.monotonic(), cpu_s(pid)
        session.post(f"{URL}/v1/topics/{live}/messages:batch", headers=headers, timeout=60,
                     json={"messages": [{"id": f"live{k}", "delay_ms": 1000 * k, "payload": k}
                                        for k in range(1, LIVE_MESSAGES + 1)]}
                     ).raise_for_status()
        for n in range(NEW_TOPICS):
            time.sleep(max(0.0, started + 1 + NEW_EVERY_S * n - time.monotonic()))
            name = f"fresh{run}{n}"
            session.put(f"{URL}/v1/topics/{name}", headers=headers, timeout=60, json={
                "delivery": {"mode": "webhook", "url": target.url}}).raise_for_status()
            made.append(name)
            session.post(f"{URL}/v1/topics/{name}/messages", headers=headers, timeout=60,
                         json={"id": f"new{n}", "delay_ms": 200, "payload": n}
                         ).raise_for_status()
        time.sleep(max(0.0, started + LIVE_MESSAGES + 15 - time.monotonic()))
        cores = (cpu_s(pid) - cpu_before) / (time.monotonic() - started)
        due = {a.message_id: parse_instant(a.headers["Duetime-Deliver-At"])
               for a in target.arrivals}
        lag = {a.message_id: a.received_ms - due[a.message_id] for a in target.arrivals}
        restarted_ms = int((time.time() - (time.monotonic() - started)) * 1000)
        late = {m: {"lag_ms": ms, "due_after_restart_ms": due[m] - restarted_ms}
                for m, ms in lag.items() if ms >= LATE_MS}
    steps = step_seconds()
    for name in made:
        session.delete(f"{URL}/v1/topics/{name}", headers=headers, timeout=60)
    result = {
        "topics": count, "releaser_cores": round(cores, 3), "releaser_steps": steps,
        "new_topic_lag_ms": _lags([lag.get(f"new{n}") for n in range(NEW_TOPICS)]),
        "live_topic_lag_ms": _lags([lag.get(f"live{k}")
                                    for k in range(1, LIVE_MESSAGES + 1)]),
        "live_topic_lag_ms_after_2s": _lags([lag.get(f"live{k}")
                                             for k in range(3, LIVE_MESSAGES + 1)]),
        "late_messages": late}
    OUT.mkdir(exist_ok=True)
    (OUT / "crowded.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:28} {json.dumps(value) if isinstance(value, dict) else value}")
    lags = [result["new_topic_lag_ms"], result["live_topic_lag_ms"]]
    return 0 if all(x["delivered"] == x["of"] and x["early"] == 0 for x in lags) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
