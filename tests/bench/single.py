"""`make bench` (one message per request): how most HTTP producers and worker pools call a
queue, side by side with the batch paths of the same run.

Against the running stack (`make up`), each phase on a fresh topic created a moment before:
1. idle stack, one client, one request at a time: enqueue (one message, due now), lease
   `max: 1`, ack; latency p50/p99/max of each (ms);
2. enqueue, one message per request, PRODUCERS threads: msgs/s; the same with `if_exists:
   replace` moving a scheduled message (each id enqueued before); and in the same run
   batches of 1,000 from the same threads: the ratios;
3. lease `max: 1` + ack, CONSUMERS threads on the backlog phase 2 enqueued: msgs/s; one
   consumer alone on a backlog of half the size, enqueued the same way: msgs/s, and what
   the CONSUMERS gain over it (the pool's rate divided by the one's), each with the share
   of the machine's cores busy meanwhile (one consumer keeping a share b busy, a pool
   gains little more than 1 / b on that machine unless its calls share work); and lease
   100 + one batch ack on the same backlog size: the ratio;
4. the raw-Cassandra ceiling of the same run (tests.bench.run.raw_ceiling);
5. the HTTP floor of the same run: requests that touch no Cassandra from PRODUCERS threads
   (`GET /healthz`; an authenticated enqueue answered 400 by validation) and one client's
   p50 of each. No one-message path can beat them, so a one-message rate above the floor's
   share of the batch rate is out of reach on that machine whatever the store does;
6. the client's own cost: one client's `GET /healthz` through duetime's client and through
   a `requests.Session`, p50 and client CPU per call (on a small machine the client shares
   the cores with the API and Cassandra);
7. the floors (tests/bench/bare_app.py), each served by gunicorn with duetime's settings
   beside the stack and called as duetime is: a Flask app that does nothing but answer
   duetime's one-message routes (the no-op app: what a request costs on the machine before
   any of duetime's code runs), and one that makes duetime's own Cassandra requests of each
   call and nothing else (the storage floor). The one-message enqueue rate and the lease
   `max: 1` + ack pair rate are reported as ratios to the no-op app's
   and to the storage floor's; the storage floor's against the no-op app's is the most
   those requests allow on the machine when calls share none;
8. the machine's speed through the run (tests.bench.run.SpeedTrack): a shared host's moves
   by several times within minutes, so absolute rates of two runs compare only at like
   speeds;
9. where each one-message call's CPU goes, duetime's (phases 2 and 3) and each floor's: core-ms
   a call of the API, releaser, node and client, and of the whole machine; and the machine's
   CPU a call that half the no-op app's rate leaves, beside what duetime's releaser, node and
   client spent (when they alone exceed it, no API reaches that half on the machine); and
   the most CONSUMERS could gain over one consumer at the pool's machine CPU a pair.
Every call goes through duetime's own client (duetime_client.Client, urllib3 keep-alive, no
retries, so a 429 or 503 fails the run instead of hiding in it), the path the README shows
Python producers and consumers.
Writes bench-results/single.json and prints a table. Usage:
python -m tests.bench.single [N=2000]
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from duetime_client.client import ApiError, Client

from app.config import load_config
from app.store.session import CassandraSession
from tests.bench import bare_app
from tests.bench.run import (
    OUT,
    URL,
    SpeedTrack,
    busy_share,
    cassandra_pid,
    consume,
    cpu_s,
    cpu_ticks,
    dev_headers,
    enqueue,
    make_topic,
    now_ms,
    percentile,
    process_tree,
    raw_ceiling,
    stack_cpu_s,
    timed_threads,
)
from tests.serving import start_api, wait_ready

PRODUCERS = 4
CONSUMERS = 8
IDLE_CALLS = 300


def _summary(values: list[float]) -> dict[str, float]:
    """p50, p99 and max in ms, to 0.1 ms (whole ms would read 4.9 as 4)."""
    tenths = [int(v * 10_000) for v in values]
    return {"p50": percentile(tenths, 0.5) / 10, "p99": percentile(tenths, 0.99) / 10,
            "max": max(tenths, default=0) / 10}


def client_of(headers: dict[str, str]) -> Client:
    """duetime's client with the dev key, shared by the run's threads; no retries."""
    return Client(URL, headers["Authorization"].split()[1], timeout_s=60, retries=0,
                  connections=CONSUMERS)


def idle_latency(api: Client, headers: dict[str, str]) -> dict[str, dict[str, float]]:
    """One client, one call at a time, on a topic created a moment ago."""
    topic = make_topic(headers)
    took: dict[str, list[float]] = {"enqueue": [], "lease": [], "ack": []}
    for n in range(IDLE_CALLS):
        began = time.perf_counter()
        api.enqueue(topic, {"n": n})
        took["enqueue"].append(time.perf_counter() - began)
    for _ in range(IDLE_CALLS):
        began = time.perf_counter()
        leased = api.lease(topic, 1, 1000)
        took["lease"].append(time.perf_counter() - began)
        if not leased:
            continue
        began = time.perf_counter()
        api.ack(topic, leased[0])
        took["ack"].append(time.perf_counter() - began)
    api.delete_topic(topic)
    return {name: _summary(values) for name, values in took.items()}


def enqueue_singly(api: Client, topic: str, count: int) -> float:
    """msgs/s of count single-message enqueues from PRODUCERS threads."""
    def produce(mine: range) -> None:
        for n in mine:
            api.enqueue(topic, {"n": n})

    return count / timed_threads([functools.partial(produce, range(k, count, PRODUCERS))
                                  for k in range(PRODUCERS)])


def replace_singly(api: Client, topic: str, count: int) -> float:
    """msgs/s of count single-message enqueues with `if_exists: replace` from PRODUCERS
    threads, each moving a scheduled message (enqueued before, in batches) an hour later
    with a new payload."""
    later = now_ms() + 3_600_000
    for first in range(0, count, 1000):
        api.enqueue_batch(topic, [{"id": f"r{n}", "payload": {"n": n}, "deliver_at": later}
                                  for n in range(first, min(first + 1000, count))])

    def produce(mine: range) -> None:
        for n in mine:
            answer = api.enqueue(topic, {"n": n, "v": 2}, id=f"r{n}", if_exists="replace",
                                 deliver_at=later + 3_600_000)
            if answer.get("deliver_at") is None:
                raise RuntimeError(f"replace of r{n} answered {answer}")

    return count / timed_threads([functools.partial(produce, range(k, count, PRODUCERS))
                                  for k in range(PRODUCERS)])


def lease_singly(api: Client, topic: str, count: int, consumers: int = CONSUMERS) -> float:
    """msgs/s of lease `max: 1` + ack from `consumers` threads until count are acked (an ack
    refused because the lease was lost is not counted)."""
    acked = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal acked
        while True:
            with lock:
                if acked >= count:
                    return
            for message in api.lease(topic, 1, 1000):
                try:
                    api.ack(topic, message)
                except ApiError as refused:
                    if refused.status != 409:
                        raise
                    continue
                with lock:
                    acked += 1

    return count / timed_threads([work] * consumers)


def _one_at_a_time(call: Callable[[], None]) -> list[float]:
    """Seconds each of IDLE_CALLS calls took, made one after another."""
    took = []
    for _ in range(IDLE_CALLS):
        began = time.perf_counter()
        call()
        took.append(time.perf_counter() - began)
    return took


def http_floor(api: Client, topic: str, count: int) -> dict[str, Any]:
    """Requests/s from PRODUCERS threads, and one client's p50 (ms), of requests that touch
    no Cassandra: `GET /healthz`, and an enqueue that validation refuses (400) after auth.
    Each call checks its answer: a floor that measured something else fails the run."""
    def healthz() -> None:
        if api.request("GET", "/healthz") != {"status": "ok"}:
            raise RuntimeError("GET /healthz did not answer its status")

    def refused_enqueue() -> None:
        try:
            api.enqueue(topic, {}, deliver_at="never")
        except ApiError as refused:
            if refused.status == 400:
                return
            raise
        raise RuntimeError("an enqueue due 'never' was accepted")

    calls = {"healthz": healthz, "refused_enqueue": refused_enqueue}
    floor: dict[str, Any] = {}
    for name, call in calls.items():
        floor[f"{name}_per_s"], floor[f"{name}_idle_p50_ms"] = _rate_and_p50(call, count)
    return floor


def _rate_and_p50(call: Callable[[], None], count: int) -> tuple[float, float]:
    """Calls/s of count calls from PRODUCERS threads, and the p50 (ms) of IDLE_CALLS made one
    at a time before."""
    took = _one_at_a_time(call)

    def hammer(n: int) -> None:
        for _ in range(n):
            call()

    share = count // PRODUCERS
    rate = share * PRODUCERS / timed_threads([functools.partial(hammer, share)] * PRODUCERS)
    return round(rate, 1), _summary(took)["p50"]


def cpu_per_call(run: Callable[[], float], calls: int,
                 processes: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
    """run()'s rate, and the CPU ms each of processes() (name: CPU s so far) spent per call
    meanwhile, with the whole machine's busy core-ms per call as "machine"."""
    before, machine_before = processes(), cpu_ticks()
    rate = run()
    after, machine_after = processes(), cpu_ticks()
    per_call = {name: round((after[name] - before[name]) * 1000 / calls, 2) for name in before}
    busy_ms = (machine_after[0] - machine_before[0]) * 1000 / os.sysconf("SC_CLK_TCK")
    per_call["machine"] = round(busy_ms / calls, 2)
    return rate, per_call


def stack_and_client_cpu_s() -> dict[str, float]:
    """CPU seconds so far of the stack `make up` started (tests.bench.run.stack_cpu_s) and of
    this process, the client."""
    return {**stack_cpu_s(), "client": time.process_time()}


def half_noop_budget(cpu: dict[str, dict[str, float]], bare: dict[str, Any]
                     ) -> dict[str, dict[str, float]]:
    """Per call, the machine's CPU (core-ms) that half the no-op app's rate leaves each
    enqueue and each lease + ack pair (a bar of 0.5 of the no-op app), against what
    duetime's releaser, Cassandra and client spent per call: when those alone exceed it, no
    API could reach that half on this machine."""
    cores = os.cpu_count() or 1
    rates = {"enqueue": bare["enqueue_one_per_s"],
             "lease1_ack_pair": bare["lease1_ack_pairs_per_s"]}
    return {kind: {"budget_ms": round(cores * 1000 / (rates[kind] / 2), 2),
                   "beside_the_api_ms": round(sum(v for k, v in cpu[kind].items()
                                                  if k in ("releaser", "cassandra", "client")),
                                              2)}
            for kind in rates}


BARE_PORT = 18099


def bare_floor(headers: dict[str, str], count: int, app: str = "tests.bench.bare_app:app"
               ) -> dict[str, Any]:
    """One of the floors of tests/bench/bare_app.py under gunicorn with app/gunicorn_conf.py
    (same workers and threads), called through duetime's client as duetime is: `GET /healthz`
    from PRODUCERS threads (requests/s, and one client's p50 in ms), count one-message
    enqueues from PRODUCERS threads (msgs/s), count lease `max: 1` + ack pairs from
    CONSUMERS threads and count / 2 from one (pairs/s); the CPU a call of the enqueues and
    of the pairs from CONSUMERS threads (cpu_per_call: the app's gunicorn, Cassandra, the
    client)."""
    base = f"http://127.0.0.1:{BARE_PORT}"
    server = start_api({**os.environ, "DUETIME_HTTP_PORT": str(BARE_PORT),
                        "DUETIME_HTTP_HOST": "127.0.0.1"}, app=app)
    bare = Client(base, headers["Authorization"].split()[1], timeout_s=60, retries=0,
                  connections=CONSUMERS)
    try:
        if not wait_ready(base, server, 30, path="/healthz"):
            raise RuntimeError(f"{app} did not start")

        def healthz() -> None:
            if bare.request("GET", "/healthz") != {"status": "ok"}:
                raise RuntimeError(f"{app} did not answer its status")

        rate, p50 = _rate_and_p50(healthz, count)
        pids = process_tree(server.pid)

        def processes() -> dict[str, float]:
            return {"api": sum(cpu_s(p) for p in pids), "cassandra": cpu_s(cassandra_pid()),
                    "client": time.process_time()}

        enqueue_rate, enqueue_cpu = cpu_per_call(
            lambda: enqueue_singly(bare, "floor", count), count, processes)
        pairs_rate, pairs_cpu = cpu_per_call(
            lambda: lease_singly(bare, "floor", count), count, processes)
        return {"healthz_per_s": rate, "healthz_idle_p50_ms": p50,
                "enqueue_one_per_s": round(enqueue_rate, 1),
                "lease1_ack_pairs_per_s": round(pairs_rate, 1),
                "lease1_ack_one_consumer_pairs_per_s": round(
                    lease_singly(bare, "floor", count // 2, consumers=1), 1),
                "cpu_ms_per_call": {"enqueue": enqueue_cpu, "lease1_ack_pair": pairs_cpu}}
    finally:
        bare.close()
        server.terminate()
        server.wait(30)


def storage_floor(headers: dict[str, str], count: int) -> dict[str, Any]:
    """bare_floor of the storage floor app, its tables made first in the stack's keyspace."""
    db = CassandraSession(load_config())
    try:
        bare_app.create_tables(db)
    finally:
        db.shutdown()
    return bare_floor(headers, count, "tests.bench.bare_app:storage_app")


def _against(rates: dict[str, float], floor: dict[str, float]) -> dict[str, float]:
    """Each one-message rate of `rates` divided by the same one of `floor`."""
    names = ("enqueue_one_per_s", "lease1_ack_pairs_per_s",
             "lease1_ack_one_consumer_pairs_per_s")
    return {name.removesuffix("_per_s"): round(rates[name] / floor[name], 3) for name in names}


def client_cost(api: Client) -> dict[str, dict[str, float]]:
    """One client's `GET /healthz`, one call at a time, through duetime's client and through a
    requests.Session: latency p50 (ms) and the calling process's CPU per call (ms)."""
    session = requests.Session()

    def through_requests() -> None:
        session.get(f"{URL}/healthz", timeout=60).raise_for_status()

    def through_duetime() -> None:
        api.request("GET", "/healthz")

    cost: dict[str, dict[str, float]] = {}
    calls: dict[str, Callable[[], None]] = {"duetime_client": through_duetime,
                                            "requests": through_requests}
    for name, call in calls.items():
        cpu_began = time.process_time()
        took = _one_at_a_time(call)
        cpu_ms = (time.process_time() - cpu_began) * 1000 / IDLE_CALLS
        cost[name] = {"p50_ms": _summary(took)["p50"], "cpu_ms_per_call": round(cpu_ms, 2)}
    return cost


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 2000
    headers = dev_headers()
    api = client_of(headers)
    speed = SpeedTrack()
    idle = idle_latency(api, headers)
    single_topic = make_topic(headers)
    single_rate, enqueue_cpu = cpu_per_call(lambda: enqueue_singly(api, single_topic, count),
                                            count, stack_and_client_cpu_s)
    replace_topic = make_topic(headers)
    replace_rate = replace_singly(api, replace_topic, count)
    batch_topic = make_topic(headers)
    batch_rate, _ = enqueue(headers, batch_topic, count * 5, now_ms(), 0, PRODUCERS)
    busy_before = cpu_ticks()
    lease_one, pairs_cpu = cpu_per_call(lambda: lease_singly(api, single_topic, count), count,
                                        stack_and_client_cpu_s)
    busy_pool = busy_share(busy_before, cpu_ticks())
    alone_topic = make_topic(headers)
    enqueue_singly(api, alone_topic, count // 2)
    busy_before = cpu_ticks()
    lease_alone = lease_singly(api, alone_topic, count // 2, consumers=1)
    busy_alone = busy_share(busy_before, cpu_ticks())
    received, seconds = consume(headers, batch_topic, count * 5, CONSUMERS, 300)
    lease_batch = len(received) / seconds
    ceiling = raw_ceiling(5000)
    floor = http_floor(api, single_topic, count)
    bare = bare_floor(headers, count)
    storage = storage_floor(headers, count)
    result: dict[str, Any] = {
        "idle_one_client_ms": idle,
        "enqueue_one_per_request_msgs_per_s": round(single_rate, 1),
        "enqueue_batches_msgs_per_s": round(batch_rate, 1),
        "enqueue_one_vs_batches": round(single_rate / batch_rate, 3),
        "enqueue_replace_one_per_request_msgs_per_s": round(replace_rate, 1),
        "enqueue_replace_vs_enqueue_one": round(replace_rate / single_rate, 3),
        "lease1_ack_msgs_per_s": round(lease_one, 1),
        "lease1_ack_one_consumer_msgs_per_s": round(lease_alone, 1),
        f"lease1_ack_{CONSUMERS}_consumers_vs_one": round(lease_one / lease_alone, 2),
        "lease1_ack_machine_busy": {"consumers": round(busy_pool, 3),
                                    "one_consumer": round(busy_alone, 3)},
        "lease100_batch_ack_msgs_per_s": round(lease_batch, 1),
        "lease1_vs_batches": round(lease_one / lease_batch, 3),
        **{k: round(v) for k, v in ceiling.items()},
        "enqueue_one_vs_raw_insert": round(single_rate / ceiling["raw_insert_rows_per_s"], 3),
        "lease1_ack_vs_raw_lwt_pairs": round(lease_one / (ceiling["raw_lwt_per_s"] / 2), 3),
        "http_floor": floor,
        "client_cost_healthz": client_cost(api),
        # the most a one-message path could reach here: one request that does nothing per
        # enqueue, two (lease and ack) per leased message
        "floor_vs_enqueue_batches": round(floor["refused_enqueue_per_s"] / batch_rate, 3),
        "floor_vs_lease_batches": round(floor["refused_enqueue_per_s"] / 2 / lease_batch, 3),
        # and the same for a Flask app that does nothing, on the same gunicorn settings
        "bare_floor": bare,
        "bare_floor_vs_enqueue_batches": round(bare["healthz_per_s"] / batch_rate, 3),
        "bare_floor_vs_lease_batches": round(bare["healthz_per_s"] / 2 / lease_batch, 3),
        # the ratios that travel between machines: each one-message path against the bare
        # app's requests (one per enqueue; two, lease and ack, per leased message)
        "enqueue_one_vs_bare_floor": round(single_rate / bare["healthz_per_s"], 3),
        "lease1_ack_vs_bare_floor_pairs": round(lease_one / (bare["healthz_per_s"] / 2), 3),
        # the one-message ratios: against the no-op app's own enqueue route, and its lease +
        # ack pairs from as many consumers
        "enqueue_one_vs_noop_app": round(single_rate / bare["enqueue_one_per_s"], 3),
        "lease1_ack_vs_noop_app_pairs": round(lease_one / bare["lease1_ack_pairs_per_s"], 3),
        # the storage floor (tests/bench/bare_app.py): duetime's own requests of each call
        # and nothing else; against the no-op app, the most those requests allow on this
        # machine when calls share none; duetime against it, what its own work costs
        "storage_floor": storage,
        "storage_floor_vs_noop_app": _against(storage, bare),
        "duetime_vs_storage_floor": _against(
            {"enqueue_one_per_s": single_rate, "lease1_ack_pairs_per_s": lease_one,
             "lease1_ack_one_consumer_pairs_per_s": lease_alone}, storage),
        # where each one-message call's CPU went (core-ms a call, each process, and the whole
        # machine busy), duetime's and the no-op app's; and the machine's CPU a call that half
        # the no-op app's rate leaves, against what duetime spends beside its API
        "cpu_ms_per_call": {"enqueue": enqueue_cpu, "lease1_ack_pair": pairs_cpu},
        "noop_app_cpu_ms_per_call": bare["cpu_ms_per_call"],
        "half_noop_budget_per_call": half_noop_budget(
            {"enqueue": enqueue_cpu, "lease1_ack_pair": pairs_cpu}, bare),
        # the most the CONSUMERS could gain over one on this machine at the pool's CPU a pair
        # (all cores busy with pairs alone), against what they gained
        f"lease1_ack_{CONSUMERS}_consumers_vs_one_most": round(
            (os.cpu_count() or 1) * 1000 / pairs_cpu["machine"] / lease_alone, 2),
        f"storage_floor_{CONSUMERS}_consumers_vs_one": round(
            storage["lease1_ack_pairs_per_s"] / storage["lease1_ack_one_consumer_pairs_per_s"],
            2),
        # the host's speed through the run (tests.bench.run.SpeedTrack: lower is faster)
        "machine_loop_ms": speed.result()}
    OUT.mkdir(exist_ok=True)
    (OUT / "single.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:36} {json.dumps(value) if isinstance(value, dict) else value}")
    for topic in (single_topic, replace_topic, batch_topic, alone_topic):
        api.delete_topic(topic)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
