"""`make bench` (one message per request): how most HTTP producers and worker pools call a
queue, side by side with the batch paths of the same run.

Against the running stack (`make up`), each phase on a fresh topic created a moment before:
1. idle stack, one client, one request at a time: enqueue (one message, due now), lease
   `max: 1`, ack; latency p50/p99/max of each (ms);
2. enqueue, one message per request, PRODUCERS threads: msgs/s; and in the same run batches
   of 1,000 from the same threads: the ratio;
3. lease `max: 1` + ack, CONSUMERS threads on a backlog: msgs/s; and lease 100 + one batch
   ack on the same backlog size: the ratio;
4. the raw-Cassandra ceiling of the same run (tests.bench.run.raw_ceiling);
5. the HTTP floor of the same run: requests that touch no Cassandra from PRODUCERS threads
   (`GET /healthz`; an authenticated enqueue answered 400 by validation) and one client's
   p50 of each. No one-message path can beat them, so a one-message rate above the floor's
   share of the batch rate is out of reach on that machine whatever the store does.
Writes bench-results/single.json and prints a table. Usage:
python -m tests.bench.single [N=2000]
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from typing import Any

import requests

from tests.bench.run import (
    OUT,
    URL,
    consume,
    dev_headers,
    enqueue,
    make_topic,
    now_ms,
    percentile,
    raw_ceiling,
    timed_threads,
)

PRODUCERS = 4
CONSUMERS = 8
IDLE_CALLS = 300


def _summary(values: list[float]) -> dict[str, float]:
    """p50, p99 and max in ms, to 0.1 ms (whole ms would read 4.9 as 4)."""
    tenths = [int(v * 10_000) for v in values]
    return {"p50": percentile(tenths, 0.5) / 10, "p99": percentile(tenths, 0.99) / 10,
            "max": max(tenths, default=0) / 10}


def idle_latency(headers: dict[str, str]) -> dict[str, dict[str, float]]:
    """One client, one call at a time, on a topic created a moment ago."""
    topic = make_topic(headers)
    session = requests.Session()
    url = f"{URL}/v1/topics/{topic}"
    took: dict[str, list[float]] = {"enqueue": [], "lease": [], "ack": []}
    for n in range(IDLE_CALLS):
        began = time.perf_counter()
        session.post(f"{url}/messages", headers=headers,
                     json={"payload": {"n": n}}).raise_for_status()
        took["enqueue"].append(time.perf_counter() - began)
    for _ in range(IDLE_CALLS):
        began = time.perf_counter()
        answer = session.post(f"{url}/leases", headers=headers, json={"max": 1, "wait_ms": 1000})
        took["lease"].append(time.perf_counter() - began)
        leased = answer.json()["messages"]
        if not leased:
            continue
        began = time.perf_counter()
        session.post(f"{url}/messages/{leased[0]['id']}/ack", headers=headers,
                     json={"lease_token": leased[0]["lease"]["token"]}).raise_for_status()
        took["ack"].append(time.perf_counter() - began)
    session.delete(url, headers=headers, timeout=60)
    return {name: _summary(values) for name, values in took.items()}


def enqueue_singly(headers: dict[str, str], topic: str, count: int) -> float:
    """msgs/s of count single-message enqueues from PRODUCERS threads."""
    def produce(mine: range) -> None:
        session = requests.Session()
        for n in mine:
            session.post(f"{URL}/v1/topics/{topic}/messages", headers=headers, timeout=60,
                         json={"payload": {"n": n}}).raise_for_status()

    return count / timed_threads([functools.partial(produce, range(k, count, PRODUCERS))
                                  for k in range(PRODUCERS)])


def lease_singly(headers: dict[str, str], topic: str, count: int) -> float:
    """msgs/s of lease `max: 1` + ack from CONSUMERS threads until count are acked."""
    acked = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal acked
        session = requests.Session()
        url = f"{URL}/v1/topics/{topic}"
        while True:
            with lock:
                if acked >= count:
                    return
            leased = session.post(f"{url}/leases", headers=headers, timeout=60,
                                  json={"max": 1, "wait_ms": 1000}).json()["messages"]
            for m in leased:
                answer = session.post(f"{url}/messages/{m['id']}/ack", headers=headers,
                                      timeout=60, json={"lease_token": m["lease"]["token"]})
                if answer.status_code == 204:
                    with lock:
                        acked += 1

    return count / timed_threads([work] * CONSUMERS)


def _expect(status: int, answer: requests.Response) -> None:
    """The floor measures what it says only while the API answers as expected."""
    if answer.status_code != status:
        raise RuntimeError(f"{answer.request.method} {answer.url}: {answer.status_code}, "
                           f"not {status}")


def http_floor(headers: dict[str, str], topic: str, count: int) -> dict[str, Any]:
    """Requests/s from PRODUCERS threads, and one client's p50 (ms), of requests that touch
    no Cassandra: `GET /healthz`, and an enqueue that validation refuses (400) after auth."""
    def healthz(session: requests.Session) -> None:
        _expect(200, session.get(f"{URL}/healthz", timeout=60))

    def refused_enqueue(session: requests.Session) -> None:
        _expect(400, session.post(f"{URL}/v1/topics/{topic}/messages", headers=headers,
                                  timeout=60, json={"payload": {}, "deliver_at": "never"}))

    calls = {"healthz": healthz, "refused_enqueue": refused_enqueue}
    floor: dict[str, Any] = {}
    for name, call in calls.items():
        session = requests.Session()
        took = []
        for _ in range(IDLE_CALLS):
            began = time.perf_counter()
            call(session)
            took.append(time.perf_counter() - began)

        def hammer(n: int, call: Any = call) -> None:
            mine = requests.Session()
            for _ in range(n):
                call(mine)

        share = count // PRODUCERS
        floor[f"{name}_per_s"] = round(share * PRODUCERS / timed_threads(
            [functools.partial(hammer, share)] * PRODUCERS), 1)
        floor[f"{name}_idle_p50_ms"] = _summary(took)["p50"]
    return floor


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 2000
    headers = dev_headers()
    idle = idle_latency(headers)
    single_topic = make_topic(headers)
    single_rate = enqueue_singly(headers, single_topic, count)
    batch_topic = make_topic(headers)
    batch_rate, _ = enqueue(headers, batch_topic, count * 5, now_ms(), 0, PRODUCERS)
    lease_one = lease_singly(headers, single_topic, count)
    received, seconds = consume(headers, batch_topic, count * 5, CONSUMERS, 300)
    lease_batch = len(received) / seconds
    ceiling = raw_ceiling(5000)
    floor = http_floor(headers, single_topic, count)
    result: dict[str, Any] = {
        "idle_one_client_ms": idle,
        "enqueue_one_per_request_msgs_per_s": round(single_rate, 1),
        "enqueue_batches_msgs_per_s": round(batch_rate, 1),
        "enqueue_one_vs_batches": round(single_rate / batch_rate, 3),
        "lease1_ack_msgs_per_s": round(lease_one, 1),
        "lease100_batch_ack_msgs_per_s": round(lease_batch, 1),
        "lease1_vs_batches": round(lease_one / lease_batch, 3),
        **{k: round(v) for k, v in ceiling.items()},
        "enqueue_one_vs_raw_insert": round(single_rate / ceiling["raw_insert_rows_per_s"], 3),
        "lease1_ack_vs_raw_lwt_pairs": round(lease_one / (ceiling["raw_lwt_per_s"] / 2), 3),
        "http_floor": floor,
        # the most a one-message path could reach here: one request that does nothing per
        # enqueue, two (lease and ack) per leased message
        "floor_vs_enqueue_batches": round(floor["refused_enqueue_per_s"] / batch_rate, 3),
        "floor_vs_lease_batches": round(floor["refused_enqueue_per_s"] / 2 / lease_batch, 3)}
    OUT.mkdir(exist_ok=True)
    (OUT / "single.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:36} {json.dumps(value) if isinstance(value, dict) else value}")
    for topic in (single_topic, batch_topic):
        requests.delete(f"{URL}/v1/topics/{topic}", headers=headers, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
