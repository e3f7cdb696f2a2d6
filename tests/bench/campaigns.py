"""`make bench` (campaigns): shift and cancel of a large campaign, its view, and pacing.

Against the running stack (`make up`: the API and one releaser, which runs the operations):
1. enqueue N messages (default 1,000,000) of one campaign, due over the hour after the next;
2. the campaign's view: 200 GETs, latency p50/p99/max (counters, no scan);
3. shift by one minute, then cancel: msgs/s from the operation's start to its end (its own
   started_at/finished_at, less the wait for every process to see the mark), and the RSS of
   the releaser running it, sampled every 100 ms from /proc (baseline before, peak during);
4. the raw-Cassandra ceiling of the same work in the same run: conditional batches of 60 rows
   a partition (what an operation sends per home), rows/s;
5. a paced campaign: 600 messages due at once at max_per_second 100, drained by 8 consumers:
   the achieved rate against the setting.
Writes bench-results/campaigns.json and prints a table. Usage: python -m tests.bench.campaigns [N]
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from app.campaigns.rules import REFRESH_MS
from app.config import load_config
from app.core.timeparse import parse_instant
from app.store.session import CassandraSession
from tests.bench.run import (
    OUT,
    URL,
    consume,
    dev_headers,
    enqueue,
    make_topic,
    now_ms,
    percentile,
    releaser_pid,
)

HOUR_MS = 3_600_000
ROWS_PER_HOME = 60


def view_latency(headers: dict[str, str], topic: str, name: str, calls: int = 200
                 ) -> dict[str, float]:
    session = requests.Session()
    took = []
    for _ in range(calls):
        began = time.perf_counter()
        session.get(f"{URL}/v1/topics/{topic}/campaigns/{name}", headers=headers,
                    timeout=30).raise_for_status()
        took.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": percentile(took, 0.5), "p99_ms": percentile(took, 0.99),
            "max_ms": max(took)}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def operation(headers: dict[str, str], topic: str, method: str, name: str,
              body: dict[str, Any] | None, pid: int) -> dict[str, Any]:
    """Start an operation and follow it to its end; its rate and the runner's RSS."""
    baseline = _rss_mib(pid)
    answer = requests.request(method, f"{URL}/v1/topics/{topic}/campaigns/{name}",
                              headers=headers, json=body, timeout=30)
    answer.raise_for_status()
    op_url = URL + answer.headers["Location"]
    peak = baseline
    while (op := requests.get(op_url, headers=headers, timeout=30).json())["state"] == "running":
        peak = max(peak, _rss_mib(pid))
        time.sleep(0.1)
    seconds = (parse_instant(op["finished_at"]) - parse_instant(op["started_at"])) / 1000
    seconds -= (REFRESH_MS + load_config().safety_lag_ms) / 1000  # the wait before reading
    return {"state": op["state"], "processed": op["processed"], "changed": op["changed"],
            "seconds": round(seconds, 1), "msgs_per_s": op["processed"] / seconds,
            "runner_rss_mib": {"before": round(baseline, 1), "peak": round(peak, 1)}}


def raw_conditional_batches(rows: int = 120_000) -> float:
    """Rows/s of conditional batches of ROWS_PER_HOME rows a partition, straight through the
    driver: the Paxos work an operation does per home."""
    db = CassandraSession(load_config())
    db.execute_raw("CREATE TABLE IF NOT EXISTS {ks}.bench_raw_home (home int, id text, "
                   "version int, PRIMARY KEY ((home), id))")
    base = uuid.uuid4().int % 1_000_000_000
    homes = [[(base + h, f"r{i}") for i in range(ROWS_PER_HOME)]
             for h in range(rows // ROWS_PER_HOME)]
    db.execute_batches("INSERT INTO {ks}.bench_raw_home (home, id, version) VALUES (?, ?, 1)",
                       homes)
    began = time.perf_counter()
    db.execute_batches("UPDATE {ks}.bench_raw_home SET version = 2 WHERE home = ? AND id = ? "
                       "IF version = 1", homes)
    rate = rows / (time.perf_counter() - began)
    db.shutdown()
    return rate


def paced(headers: dict[str, str], rate: float = 100.0, count: int = 600) -> dict[str, Any]:
    topic = make_topic(headers)
    enqueue(headers, topic, count, now_ms() + 3000, 0, campaign="paced")
    requests.patch(f"{URL}/v1/topics/{topic}/campaigns/paced", headers=headers, timeout=30,
                   json={"max_per_second": rate}).raise_for_status()
    received, _ = consume(headers, topic, count, 8, deadline_s=120)
    times = sorted(r["at"] for r in received)
    achieved = (len(times) - 1) * 1000 / (times[-1] - times[0])
    return {"setting_per_s": rate, "achieved_per_s": round(achieved, 1),
            "ratio": round(achieved / rate, 3), "delivered": len({r["id"] for r in received}),
            "early": sum(1 for r in received if r["at"] < r["due"])}


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 1_000_000
    headers = dev_headers()
    pid = releaser_pid()
    topic = make_topic(headers)
    enqueue_rate, _ = enqueue(headers, topic, count, now_ms() + HOUR_MS, HOUR_MS,
                              campaign="big")
    result: dict[str, Any] = {
        "messages": count, "enqueue_msgs_per_s": round(enqueue_rate),
        "view": view_latency(headers, topic, "big"),
        "shift": operation(headers, topic, "PATCH", "big", {"shift_ms": 60_000}, pid),
        "cancel": operation(headers, topic, "DELETE", "big", None, pid),
        "raw_conditional_rows_per_s": round(raw_conditional_batches()),
        "paced": paced(headers)}
    for kind in ("shift", "cancel"):
        result[f"{kind}_vs_raw"] = round(
            result[kind]["msgs_per_s"] / result["raw_conditional_rows_per_s"], 3)
    OUT.mkdir(exist_ok=True)
    (OUT / "campaigns.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:28} {json.dumps(value) if isinstance(value, dict) else value}")
    ok = (result["shift"]["processed"] == result["cancel"]["processed"] == count
          and result["paced"]["early"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
