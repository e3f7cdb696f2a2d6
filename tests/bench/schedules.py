"""`make bench` (schedules): N schedules (default 10,000) firing every minute on one topic.

Against the running stack (`make up`: the API and one releaser, which produces the fires):
1. create N schedules `* * * * *` (8 threads);
2. idle cost: the releaser's CPU (utime + stime from /proc) over 24 s between two minutes,
   while nothing is due (the schedules are held, not produced), and the same before they
   were created (the difference is what they cost);
3. one minute's fires: how late each was made (its row's created_at minus its fire time;
   negative is ahead: a crowd is made from up to 30 s ahead, spread over that lead), p50/p99/
   max, and the fires made per second over the production's span (set by that spread, not
   by what the releaser can make);
4. the raw-Cassandra ceiling of the same run: single-row LWTs per second (a fire costs two:
   its IF NOT EXISTS and its schedule's cursor), so the ratio travels across machines.
Writes bench-results/schedules.json and prints a table. Usage:
python -m tests.bench.schedules [N]
"""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from typing import Any

import requests

from app.config import load_config
from app.core.timeparse import cql_ms
from app.services import Services
from tests.bench.run import (
    OUT,
    URL,
    cpu_s,
    dev_headers,
    make_topic,
    now_ms,
    percentile,
    raw_ceiling,
    releaser_pid,
    timed_threads,
)

HOMES = 256  # client ids (the fire ids) hash onto this many homes (app.core.ids)


def create(headers: dict[str, str], topic: str, count: int, threads: int = 8) -> float:
    """Schedules s0..s{count-1}, every minute; seconds taken."""
    def work(mine: range) -> None:
        session = requests.Session()
        for n in mine:
            session.put(f"{URL}/v1/topics/{topic}/schedules/s{n}", headers=headers, timeout=60,
                        json={"cron": "* * * * *", "payload": {"n": n}}).raise_for_status()

    return timed_threads([functools.partial(work, range(k, count, threads))
                          for k in range(threads)])


def idle_cost(pid: int, seconds: float = 24) -> float:
    """Cores the releaser used over `seconds` starting 3 s after a minute begins: after the
    minute's fires were made, before the next minute's crowd starts being made (at most
    30 s ahead, workers.schedules.MAX_LEAD_MS)."""
    wait_ms = 63_000 - now_ms() % 60_000
    time.sleep(wait_ms / 1000 if wait_ms < 60_000 else (wait_ms - 60_000) / 1000)
    before, began = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - before) / (time.monotonic() - began)


def fires_of_minute(services: Services, topic_uid: uuid.UUID, minute_ms: int
                    ) -> list[tuple[int, int]]:
    """(fire time, created_at) of the fires of that minute (a read per home partition)."""
    futures = [services.db.execute_async(
        "SELECT id, created_at FROM {ks}.message_states WHERE topic_uid = ? AND home = ?",
        (topic_uid, home)) for home in range(HOMES)]
    found = []
    for rows in services.db.results(futures):
        for r in rows:
            if r["id"].endswith(f":{minute_ms}"):
                found.append((minute_ms, cql_ms(r["created_at"])))
    return found


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 10_000
    headers = dev_headers()
    pid = releaser_pid()
    topic = make_topic(headers)
    baseline = idle_cost(pid)
    created_s = create(headers, topic, count)
    cores = idle_cost(pid)
    minute = (now_ms() // 60_000 + 1) * 60_000
    time.sleep((minute - now_ms()) / 1000 + 40)  # the minute's fires, and time to make them
    services = Services(load_config())
    tenant = services.keys.tenant_of(headers["Authorization"].split()[1]) or ""
    found = services.topics.get(tenant, topic)
    assert found is not None
    made = fires_of_minute(services, found.uid, minute)
    services.close()
    late = [created - fire for fire, created in made]
    created_times = sorted(created for _, created in made)
    span_s = max(1, created_times[-1] - created_times[0]) / 1000 if created_times else 0
    ceiling = raw_ceiling(5000)["raw_lwt_per_s"]
    result: dict[str, Any] = {
        "schedules": count, "create_s": round(created_s, 1),
        "idle_releaser_cores": round(cores, 3), "idle_releaser_cores_before": round(baseline, 3),
        "fires_made": len(made),
        "fire_made_late_ms": {"p50": percentile(late, 0.5), "p99": percentile(late, 0.99),
                              "max": max(late, default=0)},
        "fires_per_s": round(len(made) / span_s, 1) if span_s else 0,
        "raw_lwt_per_s": round(ceiling), "fires_vs_raw_lwt_pairs": round(
            (len(made) / span_s) / (ceiling / 2), 3) if span_s else 0}
    OUT.mkdir(exist_ok=True)
    (OUT / "schedules.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:26} {json.dumps(value) if isinstance(value, dict) else value}")
    requests.delete(f"{URL}/v1/topics/{topic}", headers=headers, timeout=60)  # and schedules
    return 0 if len(made) == count else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
