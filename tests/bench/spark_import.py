"""Bulk import benchmark (issue 5): rows/s of a Spark import of N rows, against the HTTP batch
enqueue of the same rows and the raw-Cassandra ceiling, in one run, against the stack of
`make up`.

- spark: `duetime-admin spark import` of the whole file (N rows, default 1,000,000, due a month
  ahead over one day), wall time including Spark's start-up;
- http: the same rows through POST /messages:batch (1,000 per request), on the first
  --http-sample rows (the rate is what compares; all N would take the better part of an hour);
- raw: plain driver inserts of what one imported message writes (payload, pointer and state
  rows), on the first --raw-sample rows, 128 in flight: the ceiling of this client.
Writes bench-results/spark-import.json. Usage: python -m tests.bench.spark_import [--rows N]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from app.config import load_config
from app.store.session import CassandraSession
from tests.bench.run import OUT, URL, dev_headers, now_ms, report
from tests.import_files import write_csv

MONTH_MS = 30 * 86_400_000
DAY_MS = 86_400_000


def spark_import(path: Path, topic: str) -> dict[str, Any]:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app.cli", "spark", "import", str(path),
                           "--topic", topic, "--tenant", "dev"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.perf_counter() - began
    return summary


def http_enqueue(path: Path, topic: str, sample: int, headers: dict[str, str]) -> float:
    rows = []
    with path.open(encoding="utf-8") as f:
        for i, r in enumerate(csv.DictReader(f)):
            if i >= sample:
                break
            rows.append({"id": f"h{i}", "payload": {"recipient": r["recipient"],
                                                    "title": r["title"]},
                         "deliver_at": int(r["deliver_at"]), "priority": int(r["priority"])})
    session = requests.Session()
    began = time.perf_counter()
    for first in range(0, len(rows), 1000):
        answer = session.post(f"{URL}/v1/topics/{topic}/messages:batch", headers=headers,
                              json={"messages": rows[first:first + 1000]}, timeout=300)
        answer.raise_for_status()
    return len(rows) / (time.perf_counter() - began)


def raw_ceiling(sample: int) -> float:
    """Messages/s when each message is three plain inserts (payload, pointer, state)."""
    db = CassandraSession(load_config())
    db.execute_raw("CREATE TABLE IF NOT EXISTS {ks}.bench_raw3 (k uuid, id text, c int, "
                   "v blob, PRIMARY KEY ((k, id), c))")
    key = uuid.uuid4()
    body = b'{"recipient":"user1","title":"Hello 1"}'
    params = [(key, f"r{i}", c, body) for i in range(sample) for c in range(3)]
    began = time.perf_counter()
    db.execute_many("INSERT INTO {ks}.bench_raw3 (k, id, c, v) VALUES (?, ?, ?, ?)", params,
                    concurrency=128)
    rate = sample / (time.perf_counter() - began)
    db.shutdown()
    return rate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.spark_import")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--topic", default=None, help="import into this (existing) topic")
    parser.add_argument("--http-sample", type=int, default=50_000)
    parser.add_argument("--raw-sample", type=int, default=100_000)
    args = parser.parse_args(argv)
    headers = dev_headers()
    topic = args.topic or f"imp{uuid.uuid4().hex[:6]}"
    requests.put(f"{URL}/v1/topics/{topic}", headers=headers, json={},
                 timeout=30).raise_for_status()
    path = OUT / f"import-{args.rows}.csv"
    OUT.mkdir(exist_ok=True)
    if not path.exists():
        write_csv(path, args.rows, now_ms() + MONTH_MS, DAY_MS)
    spark = spark_import(path, topic)
    http_topic = f"http{uuid.uuid4().hex[:6]}"
    requests.put(f"{URL}/v1/topics/{http_topic}", headers=headers, json={},
                 timeout=30).raise_for_status()
    http_rate = (http_enqueue(path, http_topic, args.http_sample, headers)
                 if args.http_sample else 0.0)
    raw_rate = raw_ceiling(args.raw_sample) if args.raw_sample else 0.0
    spark_rate = spark["imported"] / spark["wall_s"]
    result = {"rows": args.rows, "topic": topic, "spark": spark,
              "spark_rows_per_s": spark_rate, "http_batch_rows_per_s": http_rate,
              "http_sample": args.http_sample, "raw_insert_messages_per_s": raw_rate,
              "raw_sample": args.raw_sample,
              "spark_vs_http": spark_rate / http_rate if http_rate else None,
              "spark_vs_raw": spark_rate / raw_rate if raw_rate else None}
    report("spark-import.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
