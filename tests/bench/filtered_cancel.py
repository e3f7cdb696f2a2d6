"""`make bench-filtered-cancel`: a cancel of the messages a label matches (POST
/v1/topics/{topic}/operations), messages/s.

In a keyspace of its own (duetime_bench_filtered), an API (gunicorn, 2 workers) and a new
topic of N messages labelled wave: doomed (default 100,000; the first argument) and N / 10
labelled wave: kept, enqueued by HTTP batches of 1,000, due over the hour after the next.
Then one cancel of wave: doomed, run by this tree's operation runner (workers/operations.py,
in this process, as a releaser runs it), followed to its end: processed and changed must be
N, and the kept ones all still scheduled. The rate is messages / (finished_at - started_at).
Beside it, in the same run, the ceiling of the Paxos work: conditional batches of the same
rows a partition straight through the driver (tests/bench/campaigns.py).
Writes bench-results/filtered_cancel.json and prints it.
Usage: python -m tests.bench.filtered_cancel [N]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import sys
import threading
import time
from typing import Any

import requests

from app.config import load_config
from app.core.timeparse import parse_instant
from app.models import MessageFilter
from app.services import Services
from app.store import migrations
from app.store.search import SearchStore
from tests.bench.campaigns import raw_conditional_batches
from tests.bench.run import OUT, now_ms, timed_threads
from tests.serving import serving
from workers.operations import OperationRunner

KEYSPACE = "duetime_bench_filtered"
PORT = 8098
PRODUCERS = 4
HOUR_MS = 3_600_000


def load(base: str, headers: dict[str, str], topic: str, count: int) -> float:
    """Enqueue count doomed and count // 10 kept messages from PRODUCERS threads; msgs/s."""
    start = now_ms() + HOUR_MS
    total = count + count // 10

    def produce(firsts: list[int]) -> None:
        session = requests.Session()
        for first in firsts:
            batch = [{"payload": {"i": i}, "deliver_at": start + i * HOUR_MS // total,
                      "labels": {"wave": "doomed" if i < count else "kept"}}
                     for i in range(first, min(total, first + 1000))]
            answer = session.post(f"{base}/v1/topics/{topic}/messages:batch", headers=headers,
                                  json={"messages": batch}, timeout=120)
            answer.raise_for_status()
            if any(r["status"] != 201 for r in answer.json()["results"]):
                raise SystemExit(f"enqueue failed: {answer.json()['results'][:3]}")

    firsts = list(range(0, total, 1000))
    seconds = timed_threads([functools.partial(produce, firsts[n::PRODUCERS])
                             for n in range(PRODUCERS)])
    return total / seconds


def cancel(base: str, headers: dict[str, str], topic: str, services: Services
           ) -> dict[str, Any]:
    """Start the cancel of wave:doomed, run it in this process, follow it to its end."""
    stop = threading.Event()
    runner = OperationRunner(services, "bench-filtered", stop.is_set)

    def loop() -> None:
        while not stop.is_set():
            runner.tick()
            stop.wait(0.1)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        answer = requests.post(f"{base}/v1/topics/{topic}/operations", headers=headers,
                               json={"kind": "cancel", "filter": {"label": ["wave:doomed"]}},
                               timeout=30)
        answer.raise_for_status()
        op_url = base + answer.headers["Location"]
        while (op := requests.get(op_url, headers=headers, timeout=30).json())[
                "state"] == "running":
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    seconds = (parse_instant(op["finished_at"]) - parse_instant(op["started_at"])) / 1000
    return {"state": op["state"], "processed": op["processed"], "changed": op["changed"],
            "seconds": round(seconds, 1), "msgs_per_s": round(op["processed"] / seconds)}


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 100_000
    os.environ["DUETIME_KEYSPACE"] = KEYSPACE  # the raw ceiling's table goes here too
    config = dataclasses.replace(load_config(), keyspace=KEYSPACE)
    services = Services(config)
    migrations.apply(services.db)
    tenant = f"bench-filtered-{secrets.token_hex(3)}"
    headers = {"Authorization": f"Bearer {services.keys.create(tenant)}"}
    name = f"cancel-{secrets.token_hex(3)}"
    with serving(KEYSPACE, PORT, DUETIME_WEB_WORKERS="2") as base:
        requests.put(f"{base}/v1/topics/{name}", headers=headers, json={},
                     timeout=30).raise_for_status()
        enqueue_rate = load(base, headers, name, count)
        result: dict[str, Any] = {"messages": count, "others": count // 10,
                                  "enqueue_msgs_per_s": round(enqueue_rate),
                                  "cancel": cancel(base, headers, name, services)}
    topic = services.topics.get(tenant, name)
    assert topic is not None
    kept = SearchStore(services.db).find(topic.uid, MessageFilter(
        state="scheduled", labels=(("wave", "kept"),)), count)
    result["kept_still_scheduled"] = len(kept.rows)
    result["raw_conditional_rows_per_s"] = round(raw_conditional_batches())
    result["cancel_vs_raw"] = round(
        result["cancel"]["msgs_per_s"] / result["raw_conditional_rows_per_s"], 3)
    services.close()
    OUT.mkdir(exist_ok=True)
    (OUT / "filtered_cancel.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    ok = (result["cancel"]["processed"] == result["cancel"]["changed"] == count
          and result["kept_still_scheduled"] == count // 10)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
