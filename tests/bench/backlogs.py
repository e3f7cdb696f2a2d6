"""`make bench` (idle backlogs): pull lag beside backlogs nobody leases, and the releaser's
garbage collections that holding them costs (docs/design.md, "The releaser's memory").

Against the running stack (`make up`):
1. T topics (default 60) with M messages each (default 3,000) due now that nobody leases;
   the broker holds up to 128 a fair-delivery lane of a shard of each, about 2,000 a topic;
2. the stack's releaser is restarted (from this tree), so that its walk reads them all
   again, as after a deploy, and SETTLE_S for it to do so;
3. the steady phase of tests.bench.run: RATE msgs/s onto a new topic, 8 consumers
   long-polling it; lag p50 / p99 / max, none early, lost or duplicated;
4. the releaser's full (generation 2) garbage collections, from its /metrics
   (`duetime_gc_pause_seconds`), while it read the backlogs and during the steady phase:
   how many, their seconds in all, and the bucket of the longest;
5. every topic made is deleted.
Writes bench-results/backlogs.json. Usage: python -m tests.bench.backlogs [T] [M]
"""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from typing import Any

import requests

from tests.bench.crowded import METRICS, restart_releaser
from tests.bench.run import OUT, URL, dev_headers, steady_lag, timed_threads

THREADS = 4
BATCH = 1000
SETTLE_S = 60
RATE = 300
STEADY_MESSAGES = 6000
CONSUMERS = 8


def make_backlogs(headers: dict[str, str], count: int, messages: int, run: str) -> list[str]:
    """count pull topics with `messages` due now each."""
    names = [f"backlog{run}{n}" for n in range(count)]

    def work(mine: list[str]) -> None:
        session = requests.Session()
        for name in mine:
            session.put(f"{URL}/v1/topics/{name}", headers=headers, json={},
                        timeout=60).raise_for_status()
            for first in range(0, messages, BATCH):
                batch = [{"payload": k} for k in range(first, min(messages, first + BATCH))]
                session.post(f"{URL}/v1/topics/{name}/messages:batch", headers=headers,
                             timeout=120, json={"messages": batch}).raise_for_status()

    timed_threads([functools.partial(work, names[k::THREADS]) for k in range(THREADS)])
    return names


def full_collections() -> dict[str, float]:
    """The releaser's generation 2 collections so far: count, seconds in all, and per
    histogram bucket bound (seconds) how many took at most that long."""
    found: dict[str, float] = {}
    for line in requests.get(METRICS, timeout=10).text.splitlines():
        if not line.startswith("duetime_gc_pause_seconds") or 'generation="2"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("duetime_gc_pause_seconds_count"):
            found["count"] = value
        elif line.startswith("duetime_gc_pause_seconds_sum"):
            found["sum"] = value
        elif 'le="' in line:
            found[line.split('le="', 1)[1].split('"', 1)[0]] = value
    return found


def between(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The collections from `before` to `after`: how many, seconds, the longest's bucket."""
    count = after.get("count", 0) - before.get("count", 0)
    bounds = sorted((float(b), b) for b in after if b not in ("count", "sum"))
    longest = next((b for value, b in bounds
                    if after[b] - before.get(b, 0) >= count), "+Inf") if count else None
    return {"count": int(count), "seconds": round(after.get("sum", 0) - before.get("sum", 0), 3),
            "longest_at_most_s": longest}


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 60
    messages = int(argv[1]) if len(argv) > 1 else 3000
    headers = dev_headers()
    run = uuid.uuid4().hex[:4]
    made = make_backlogs(headers, count, messages, run)
    try:
        restart_releaser()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # its metrics come up with it
            try:
                started = full_collections()
                break
            except requests.RequestException:
                time.sleep(0.2)
        time.sleep(SETTLE_S)
        settled = full_collections()
        steady = steady_lag(headers, STEADY_MESSAGES, CONSUMERS, RATE)
        after = full_collections()
    finally:
        session = requests.Session()
        for name in made:
            session.delete(f"{URL}/v1/topics/{name}", headers=headers, timeout=60)
    result = {"topics": count, "messages_each": messages,
              "full_collections_reading_backlogs": between(started, settled),
              "full_collections_steady": between(settled, after),
              "steady": steady}
    OUT.mkdir(exist_ok=True)
    (OUT / "backlogs.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:36} {json.dumps(value) if isinstance(value, dict) else value}")
    return 0 if not (steady["early"] or steady["lost"] or steady["duplicates"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
