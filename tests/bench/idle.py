"""`make bench` (idle stack): what an idle stack costs, the API, the releaser and Cassandra
together, with T drained topics (default 100), and how many Cassandra requests each of
duetime's processes makes while nothing happens.

Against the running stack (`make up`: gunicorn with its workers, one releaser, the dev node):
1. create T topics (every tenth a webhook topic to a local receiver), enqueue 10 messages due
   now on each, and drain them (pull topics leased and acked, webhook ones pushed);
2. wait SETTLE_S (caches go idle, the walk has passed the drained topics);
3. over MEASURE_S: CPU (utime + stime from /proc) of the gunicorn master and workers, the
   releaser and the Cassandra JVM, in cores; and the Cassandra requests of the API and of
   the releaser (duetime_cassandra_request_duration_seconds_count of their /metrics), per
   second;
4. then LONG_POLLERS consumers long-polling (wait 20 s, lease max 1) over the first
   POLLED_TOPICS pull topics, which stay empty: after POLL_SETTLE_S, the same figures over
   POLL_MEASURE_S (`with_long_polls`): what a worker pool waiting on quiet topics costs;
5. then one consumer on each of WIDE_POLLED_TOPICS pull topics created empty
   (`with_long_polls_wide`): what it costs per quiet topic;
6. then, from LATER_AT_S after the drain, the figures of step 3 again over MEASURE_S
   (`idle_later`): an idle stack minutes later;
7. delete the topics.
Issue 14's goal: under 0.03 of a core for all three together, at most one LWT a second per
releaser. Writes bench-results/idle.json. Usage: python -m tests.bench.idle [T] [SETTLE_S].
Run it on a keyspace of its own (DUETIME_KEYSPACE=idlebench
make up): a keyspace holding backlogs nobody consumes is not idle.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.run import URL, dev_headers, now_ms, report, stack_cpu_s
from tests.receiver import Receiver, receiving

SETTLE_S = 45
MEASURE_S = 60
LONG_POLLERS = 8
POLLED_TOPICS = 4
WIDE_POLLED_TOPICS = 32
POLL_SETTLE_S = 10
POLL_MEASURE_S = 30
LATER_AT_S = 300
REQUESTS = "duetime_cassandra_request_duration_seconds_count"


def requests_made(url: str) -> float:
    """Cassandra requests made so far by the process(es) behind a /metrics page."""
    text = requests.get(url, timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == REQUESTS)


def make_drained_topics(headers: dict[str, str], count: int, target: Receiver) -> list[str]:
    names = []
    for n in range(count):
        name = f"idle{n}-{now_ms() % 100_000}"
        settings: dict[str, Any] = ({"delivery": {"mode": "webhook", "url": target.url}}
                                    if n % 10 == 0 else {})
        requests.put(f"{URL}/v1/topics/{name}", headers=headers, json=settings,
                     timeout=30).raise_for_status()
        requests.post(f"{URL}/v1/topics/{name}/messages:batch", headers=headers, timeout=30,
                      json={"messages": [{"payload": i} for i in range(10)]}
                      ).raise_for_status()
        names.append(name)
    pushed = sum(1 for n in range(count) if n % 10 == 0) * 10
    for n, name in enumerate(names):
        if n % 10 == 0:
            continue
        left = 10
        while left:
            leased = requests.post(f"{URL}/v1/topics/{name}/leases", headers=headers,
                                   json={"max": 10, "wait_ms": 1000}, timeout=30).json()
            acks = [{"id": m["id"], "lease_token": m["lease"]["token"]}
                    for m in leased["messages"]]
            if acks:
                requests.post(f"{URL}/v1/topics/{name}/acks", headers=headers,
                              json={"acks": acks}, timeout=30).raise_for_status()
            left -= len(acks)
    assert target.wait_for(lambda got: len(got) >= pushed, 60), len(target.arrivals)
    return names


def measure(seconds: float) -> dict[str, Any]:
    port = os.environ.get("DUETIME_RELEASER_METRICS_PORT", "9464")
    releaser_metrics = f"http://127.0.0.1:{port}/metrics"
    api_metrics = f"http://127.0.0.1:{os.environ.get('DUETIME_API_METRICS_PORT', '9463')}/metrics"
    cpu_before = stack_cpu_s()
    calls_before = {"api": requests_made(api_metrics),
                    "releaser": requests_made(releaser_metrics)}
    began = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - began
    cores = {k: round((v - cpu_before[k]) / elapsed, 4) for k, v in stack_cpu_s().items()}
    calls = {"api": requests_made(api_metrics),
             "releaser": requests_made(releaser_metrics)}
    return {"cores": {**cores, "total": round(sum(cores.values()), 4)},
            "cassandra_requests_per_s": {k: round((calls[k] - calls_before[k]) / elapsed, 2)
                                         for k in calls}}


def measure_long_polls(headers: dict[str, str], topics: list[str],
                       consumers: int = LONG_POLLERS) -> dict[str, Any]:
    """measure() while `consumers` consumers long-poll these (empty) pull topics, in turn."""
    stop = threading.Event()
    calls = [0]

    def consume(name: str) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.post(f"{URL}/v1/topics/{name}/leases", headers=headers,
                             json={"max": 1, "wait_ms": 20_000}, timeout=40).raise_for_status()
                calls[0] += 1

    threads = [threading.Thread(target=consume, args=(topics[n % len(topics)],), daemon=True)
               for n in range(consumers)]
    for thread in threads:
        thread.start()
    time.sleep(POLL_SETTLE_S)
    result = {"consumers": consumers, "topics": len(topics), "measured_s": POLL_MEASURE_S,
              **measure(POLL_MEASURE_S)}
    stop.set()
    for thread in threads:
        thread.join(45)
    result["lease_calls"] = calls[0]
    return result


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 100
    settle_s = int(argv[1]) if len(argv) > 1 else SETTLE_S
    headers = dev_headers()
    with receiving(Receiver()) as target:
        names = make_drained_topics(headers, count, target)
        drained_at = time.monotonic()
        time.sleep(settle_s)
        result = {"topics": count, "settled_s": settle_s, "measured_s": MEASURE_S,
                  **measure(MEASURE_S)}
        pulled = [name for n, name in enumerate(names) if n % 10 != 0][:POLLED_TOPICS]
        result["with_long_polls"] = measure_long_polls(headers, pulled)
        empty = [f"wide{n}-{now_ms() % 100_000}" for n in range(WIDE_POLLED_TOPICS)]
        for name in empty:
            requests.put(f"{URL}/v1/topics/{name}", headers=headers, json={},
                         timeout=30).raise_for_status()
        result["with_long_polls_wide"] = measure_long_polls(headers, empty, len(empty))
        time.sleep(max(0.0, drained_at + LATER_AT_S - time.monotonic()))
        result["idle_later"] = {"after_drain_s": round(time.monotonic() - drained_at),
                                "measured_s": MEASURE_S, **measure(MEASURE_S)}
    for name in names + empty:
        requests.delete(f"{URL}/v1/topics/{name}", headers=headers, timeout=30)
    report("idle.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
