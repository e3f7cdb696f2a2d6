"""`make bench` (overload): the API offered twice the one-message enqueue rate it sustains.

Against the running stack (`make up`):
1. sustainable rate: SUSTAIN_PRODUCERS threads enqueue one message per request for PHASE_S;
   their rate R (msgs/s) is what the stack sustains;
2. overload: for PHASE_S, GENERATORS open-loop processes offer 2 x R requests a second
   together (each sent on schedule from a pool of OPEN_LOOP_THREADS threads, whether or not
   earlier ones were answered; what they manage to offer is reported beside it),
   while a prober calls /readyz and a consumer leases `max: 1` + acks every PROBE_EVERY_S;
3. afterwards: every message answered 201 is read back (nothing accepted lost), answers by
   status (201, 503 overloaded with Retry-After, anything else), the latency of accepted
   enqueues, of /readyz and of leases during the overload (p50/p99/max), and the API
   workers' resident memory before, at the end of, and after the overload.
Writes bench-results/overload.json. Usage: python -m tests.bench.overload [PHASE_S=20]
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import sys
import threading
import time
from typing import Any

import requests

from tests.bench.campaigns import _rss_mib
from tests.bench.run import (
    URL,
    api_pids,
    dev_headers,
    make_topic,
    percentile,
    report,
    timed_threads,
)

SUSTAIN_PRODUCERS = 8
GENERATORS = 2  # processes offering the load
OPEN_LOOP_THREADS = 128  # each
PROBE_EVERY_S = 0.25
READ_BACK_THREADS = 16


def _ms_summary(values: list[float]) -> dict[str, float]:
    ms = [int(v * 1000) for v in values]
    return {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms, default=0),
            "n": len(ms)}


def sustainable_rate(headers: dict[str, str], topic: str, seconds: float) -> float:
    """Messages a second SUSTAIN_PRODUCERS closed-loop producers get accepted."""
    done = [0] * SUSTAIN_PRODUCERS
    stop = time.monotonic() + seconds

    def producer(n: int) -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            answer = session.post(f"{URL}/v1/topics/{topic}/messages", headers=headers,
                                  json={"payload": {"n": n}}, timeout=60)
            if answer.status_code == 201:
                done[n] += 1

    elapsed = timed_threads([lambda n=n: producer(n) for n in range(SUSTAIN_PRODUCERS)])
    return sum(done) / elapsed


class Prober(threading.Thread):
    """/readyz and a lease `max: 1` + ack, every PROBE_EVERY_S, timed, until stopped."""

    def __init__(self, headers: dict[str, str], topic: str) -> None:
        super().__init__(daemon=True)
        self.headers, self.topic = headers, topic
        self.ready: list[float] = []
        self.leases: list[float] = []
        self.failures: collections.Counter[str] = collections.Counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        base = f"{URL}/v1/topics/{self.topic}"
        while not self.stopping.wait(PROBE_EVERY_S):
            began = time.perf_counter()
            ready = session.get(f"{URL}/readyz", timeout=60)
            self.ready.append(time.perf_counter() - began)
            if ready.status_code != 200:
                self.failures[f"readyz {ready.status_code}"] += 1
            began = time.perf_counter()
            leased = session.post(f"{base}/leases", headers=self.headers,
                                  json={"max": 1, "wait_ms": 0}, timeout=60)
            self.leases.append(time.perf_counter() - began)
            if leased.status_code != 200:
                self.failures[f"lease {leased.status_code}"] += 1
                continue
            for m in leased.json()["messages"]:
                session.post(f"{base}/messages/{m['id']}/ack", headers=self.headers,
                             json={"lease_token": m["lease"]["token"]}, timeout=60)


def _offer(headers: dict[str, str], topic: str, rate: float, seconds: float, first: int,
           step: int, began: float, out: Any) -> None:
    """One generator process: ids first, first + step, ... sent on schedule at `rate`/s
    from `began` (monotonic) for `seconds`; its findings go to the pipe `out`."""
    statuses: collections.Counter[str] = collections.Counter()
    retry_after: collections.Counter[str] = collections.Counter()
    accepted: list[str] = []
    latency: list[float] = []
    lock = threading.Lock()
    local = threading.local()

    def send(n: int) -> None:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        sent = time.perf_counter()
        try:
            answer = session.post(f"{URL}/v1/topics/{topic}/messages", headers=headers,
                                  json={"id": f"o-{n}", "payload": {"n": n}}, timeout=60)
        except requests.RequestException as exc:
            with lock:
                statuses[type(exc).__name__] += 1
            return
        took = time.perf_counter() - sent
        with lock:
            statuses[str(answer.status_code)] += 1
            if answer.status_code in (200, 201):
                accepted.append(f"o-{n}")
                latency.append(took)
            elif "Retry-After" in answer.headers:
                retry_after[answer.headers["Retry-After"]] += 1

    total = int(rate * seconds)
    with concurrent.futures.ThreadPoolExecutor(OPEN_LOOP_THREADS) as pool:
        for k in range(total):
            wait = began + k / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            pool.submit(send, first + k * step)
        offered_s = time.monotonic() - began
    out.send({"offered": total, "offered_s": offered_s, "answered_s": time.monotonic() - began,
              "statuses": statuses, "retry_after": retry_after, "accepted": accepted,
              "latency": latency})


def overload(headers: dict[str, str], topic: str, rate: float,
             seconds: float) -> dict[str, Any]:
    """Offer `rate` enqueues a second, on schedule, for `seconds`, from GENERATORS processes
    (one Python process cannot send fast enough to overload the API)."""
    began = time.monotonic() + 1
    pipes, processes = [], []
    for g in range(GENERATORS):
        receiving, sending = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.Process(target=_offer, args=(
            headers, topic, rate / GENERATORS, seconds, g, GENERATORS, began, sending))
        process.start()
        pipes.append(receiving)
        processes.append(process)
    parts = [pipe.recv() for pipe in pipes]
    for process in processes:
        process.join()
    statuses: collections.Counter[str] = sum((p["statuses"] for p in parts), collections.Counter())
    retry_after: collections.Counter[str] = sum((p["retry_after"] for p in parts),
                                                collections.Counter())
    offered = sum(p["offered"] for p in parts)
    return {"offered": offered,
            "offered_per_s": round(offered / max(p["offered_s"] for p in parts), 1),
            "answered_in_s": round(max(p["answered_s"] for p in parts), 1),
            "statuses": dict(statuses), "retry_after": dict(retry_after),
            "accepted": [i for p in parts for i in p["accepted"]],
            "accepted_latency_ms": _ms_summary([v for p in parts for v in p["latency"]])}


def read_back(headers: dict[str, str], topic: str, ids: list[str]) -> int:
    """How many of these ids the topic does not have (must be 0)."""
    def missing(message_id: str) -> bool:
        return requests.get(f"{URL}/v1/topics/{topic}/messages/{message_id}", headers=headers,
                            timeout=60).status_code != 200

    with concurrent.futures.ThreadPoolExecutor(READ_BACK_THREADS) as pool:
        return sum(pool.map(missing, ids))


def rss_mib() -> float:
    """Resident memory of the API's master and workers together."""
    return round(sum(_rss_mib(pid) for pid in api_pids()), 1)


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 20.0
    headers = dev_headers()
    warm = make_topic(headers)
    sustainable_rate(headers, warm, 3)  # warm-up
    rate = sustainable_rate(headers, make_topic(headers), seconds)
    topic = make_topic(headers)
    drained = make_topic(headers)
    requests.post(f"{URL}/v1/topics/{drained}/messages:batch", headers=headers, timeout=60,
                  json={"messages": [{"payload": n} for n in range(1000)]}).raise_for_status()
    rss_before = rss_mib()
    prober = Prober(headers, drained)
    prober.start()
    offered = overload(headers, topic, 2 * rate, seconds)
    rss_end = rss_mib()
    prober.stopping.set()
    prober.join()
    time.sleep(5)
    lost = read_back(headers, topic, offered["accepted"])
    result = {
        "sustainable_msgs_per_s": round(rate, 1),
        "offered_per_s": offered["offered_per_s"],
        "offered": offered["offered"],
        "answered_in_s": offered["answered_in_s"],
        "statuses": offered["statuses"],
        "retry_after": offered["retry_after"],
        "accepted": len(offered["accepted"]),
        "accepted_per_s": round(len(offered["accepted"]) / offered["answered_in_s"], 1),
        "accepted_but_missing": lost,
        "accepted_enqueue_latency_ms": offered["accepted_latency_ms"],
        "readyz_latency_ms": _ms_summary(prober.ready),
        "lease_latency_ms": _ms_summary(prober.leases),
        "probe_failures": dict(prober.failures),
        "api_rss_mib": {"before": rss_before, "end_of_overload": rss_end,
                        "after": rss_mib()},
    }
    report("overload.json", result)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
