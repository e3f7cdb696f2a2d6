"""`make bench`: throughput and delivery lag of the running stack, with a raw-Cassandra ceiling.

Against the API at DUETIME_BENCH_URL (default http://127.0.0.1:8080, started by `make up`):
1. backlog: enqueue N messages in batches of 1,000 (4 producers sending concurrently), all
   due at once, then drain them with C concurrent consumers (lease max=100 with long poll,
   then one batch ack: POST /acks): enqueue msgs/s and lease+ack msgs/s;
2. steady: with C consumers already polling, N messages come due at R per second; delivery
   lag (receive time - deliver_at) p50/p99/max, the share of the machine's cores busy
   meanwhile (stack and client) and the cores the API, the releaser and Cassandra used;
   lease calls answered with messages a second, messages a call, and the lag of the messages
   that came due while their call already waited (the others waited for a consumer to come
   back as well).
   A lag measured on a backlog would only measure the backlog. Then the same at 30 % of R
   (steady_light), N scaled alike;
3. quiet: one consumer long-polling, 200 messages due 50 ms apart (the precision a lightly
   loaded topic gets: with the pull look-ahead, a message is handed out at its due time);
   delivery lag p50/p99/max;
4. every phase: early deliveries (must be 0), lost (must be 0), duplicates;
5. in the same run, the raw-Cassandra ceiling: plain driver inserts of the same rows, and
   single-row LWTs, so the figures read as ratios.
Writes bench-results/bench.json and prints a table.
Usage: python -m tests.bench.run [N=20000] [C=8] [R=1000]
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from app.config import load_config
from app.core.timeparse import parse_instant
from app.store.session import CassandraSession

URL = os.environ.get("DUETIME_BENCH_URL", "http://127.0.0.1:8080")
OUT = Path("bench-results")
PRODUCERS = 4  # concurrent enqueue requests, as several producer processes would send
# The light steady phase runs at this percentage of R, over as long as the full one: on a
# small machine R keeps every core busy, and lag there measures the queueing for them.
LIGHT = 30


ROOT = Path(__file__).resolve().parents[2]


def dev_headers() -> dict[str, str]:
    """The Authorization header of the dev key `make up` wrote (for DUETIME_KEYSPACE)."""
    keyspace = os.environ.get("DUETIME_KEYSPACE", "duetime")
    name = "dev-key" if keyspace == "duetime" else f"dev-key-{keyspace}"
    return {"Authorization": f"Bearer {(ROOT / 'var' / name).read_text().strip()}"}


def releaser_pid() -> int:
    """The pid of the releaser `make up` started (for its CPU time)."""
    port = os.environ.get("DUETIME_HTTP_PORT", "8080")
    return int((ROOT / f"var/run/releaser-{port}.pid").read_text())


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """pid and its children (a gunicorn master's workers, a releaser's POST process)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                              text=True).stdout.split()
    return [pid, *map(int, children)]


def api_pids() -> list[int]:
    """The gunicorn master `make up` started and its workers."""
    port = os.environ.get("DUETIME_HTTP_PORT", "8080")
    return process_tree(int((ROOT / f"var/run/api-{port}.pid").read_text()))


def cassandra_pid() -> int:
    return int((ROOT / "var/cassandra/dev/cassandra.pid").read_text())


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def timed_threads(works: list[Callable[[], None]]) -> float:
    """Run each work on a thread of its own, all at once; seconds until the last ended."""
    began = time.perf_counter()
    threads = [threading.Thread(target=work) for work in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else 0.0


def enqueue(headers: dict[str, str], topic: str, count: int, start_due: int, spread_ms: int,
            producers: int = PRODUCERS, **fields: Any) -> tuple[float, set[str]]:
    """Enqueue count messages (server-made ids) in batches of 1,000 from `producers` threads,
    due evenly over spread_ms from start_due (epoch ms), each with `fields` (a campaign, say);
    (msgs/s, the ids)."""
    ids: set[str] = set()
    lock = threading.Lock()
    firsts = list(range(0, count, 1000))

    def produce(mine: list[int]) -> None:
        session = requests.Session()
        for first in mine:
            batch = [{"payload": {"i": i}, "deliver_at": start_due + i * spread_ms // count,
                      **fields} for i in range(first, min(count, first + 1000))]
            answer = session.post(f"{URL}/v1/topics/{topic}/messages:batch", headers=headers,
                                  json={"messages": batch}, timeout=120)
            answer.raise_for_status()
            results = answer.json()["results"]
            if any(r["status"] != 201 for r in results):
                raise SystemExit(f"enqueue failed: {results[:3]}")
            with lock:
                ids.update(r["id"] for r in results)

    seconds = timed_threads([functools.partial(produce, firsts[n::producers])
                             for n in range(producers)])
    if len(ids) != count:
        raise SystemExit(f"enqueue failed: {count - len(ids)} messages not accepted")
    return count / seconds, ids


def consume(headers: dict[str, str], topic: str, count: int, consumers: int,
            deadline_s: float) -> tuple[list[dict[str, Any]], float]:
    received: list[dict[str, Any]] = []
    acked: set[str] = set()
    lock = threading.Lock()
    stop_at = time.monotonic() + deadline_s

    def ack_all(session: requests.Session, messages: list[dict[str, Any]]) -> list[bool]:
        """One batch ack (POST /acks) for everything one lease call returned."""
        if not messages:
            return []
        answer = session.post(f"{URL}/v1/topics/{topic}/acks", headers=headers, timeout=60,
                              json={"acks": [{"id": m["id"], "lease_token": m["lease"]["token"]}
                                             for m in messages]})
        return [r["status"] == 204 for r in answer.json()["results"]]

    calls = itertools.count()

    def worker() -> None:
        session = requests.Session()
        while time.monotonic() < stop_at:
            with lock:
                if len(acked) >= count:
                    return
            asked = now_ms()
            answer = session.post(f"{URL}/v1/topics/{topic}/leases", headers=headers,
                                  json={"max": 100, "wait_ms": 1000}, timeout=60)
            at, call = now_ms(), next(calls)
            messages = answer.json()["messages"]
            for m, ok in zip(messages, ack_all(session, messages), strict=True):
                with lock:
                    received.append({"id": m["id"], "at": at, "asked": asked, "call": call,
                                     "due": parse_instant(m["deliver_at"])})
                    if ok:
                        acked.add(m["id"])

    return received, timed_threads([worker] * consumers)


def _raw_table() -> CassandraSession:
    """A session, and the message-shaped table the raw ceilings and floors write to."""
    db = CassandraSession(load_config())
    db.execute_raw("CREATE TABLE IF NOT EXISTS {ks}.bench_raw (topic_uid uuid, id text, "
                   "state text, version int, payload blob, PRIMARY KEY ((topic_uid, id)))")
    return db


def raw_ceiling(count: int) -> dict[str, float]:
    """Plain inserts of message-shaped rows, and single-row LWTs, straight through the driver."""
    db = _raw_table()
    topic = uuid.uuid4()
    rows = [(topic, f"r{i}", "scheduled", 1, b'{"i":1}') for i in range(count)]
    began = time.perf_counter()
    db.execute_many("INSERT INTO {ks}.bench_raw (topic_uid, id, state, version, payload) "
                    "VALUES (?, ?, ?, ?, ?)", rows, concurrency=128)
    inserts = count / (time.perf_counter() - began)
    lwt_n = min(count, 5000)
    began = time.perf_counter()
    db.execute_many("UPDATE {ks}.bench_raw SET version = 2 WHERE topic_uid = ? AND id = ? "
                    "IF version = 1", [(topic, f"r{i}") for i in range(lwt_n)], concurrency=64)
    lwts = lwt_n / (time.perf_counter() - began)
    db.shutdown()
    return {"raw_insert_rows_per_s": inserts, "raw_lwt_per_s": lwts}


def take_floor(count: int = 200, gap_ms: int = 50) -> dict[str, Any]:
    """The least a take at the due moment costs on this node, one message at a time every
    gap_ms (after the quiet phase, at its rate): a pointer-shaped insert, then a single-row
    LWT, straight through the driver, each waited for. p50/p99/max ms of the LWT alone and
    of both: what a quiet consumer's lag (which adds the wake, the payload and the
    hand-over) is compared with."""
    db = _raw_table()
    topic = uuid.uuid4()
    db.execute_many("INSERT INTO {ks}.bench_raw (topic_uid, id, state, version, payload) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(topic, f"f{i}", "scheduled", 1, b"{}") for i in range(count)],
                    concurrency=32)
    lwt_ms: list[float] = []
    both_ms: list[float] = []
    for i in range(count):
        time.sleep(gap_ms / 1000)
        began = time.perf_counter()
        db.execute("INSERT INTO {ks}.bench_raw (topic_uid, id, state, version, payload) "
                   "VALUES (?, ?, ?, ?, ?)", (topic, f"p{i}", "scheduled", 2, b""))
        middle = time.perf_counter()
        db.execute("UPDATE {ks}.bench_raw SET version = 2 WHERE topic_uid = ? AND id = ? "
                   "IF version = 1", (topic, f"f{i}"))
        ended = time.perf_counter()
        lwt_ms.append((ended - middle) * 1000)
        both_ms.append((ended - began) * 1000)
    db.shutdown()
    return {name: {"p50": round(percentile(v, 0.5), 1), "p99": round(percentile(v, 0.99), 1),
                   "max": round(max(v), 1)}
            for name, v in (("lwt_ms", lwt_ms), ("pointer_and_lwt_ms", both_ms))}


def loop_ms(iterations: int = 1_000_000) -> float:
    """CPU milliseconds of this thread for a fixed pure-Python loop, scaled to a million
    iterations: the machine's speed at that moment (lower is faster)."""
    began, total = time.thread_time(), 0
    for i in range(iterations):
        total += i * i
    return (time.thread_time() - began) * 1000 * 1_000_000 / iterations


class SpeedTrack:
    """The machine's speed through a run: loop_ms of a short loop (about 1 % of a core) every
    second on a thread of its own. A shared host's speed moves by several times within
    minutes (docs/benchmarks.md), so the absolute rates of two runs compare only at like
    speeds; ratios to a ceiling or floor of the same run move far less."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-track", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(loop_ms(100_000))

    def result(self) -> dict[str, float]:
        """Stop; {"p50", "min", "max"} ms per million iterations over the run."""
        self._stop.set()
        self._thread.join()
        ordered = sorted(self.samples) or [math.nan]
        return {"p50": round(statistics.median(ordered), 1), "min": round(ordered[0], 1),
                "max": round(ordered[-1], 1)}


def report(filename: str, result: dict[str, Any]) -> None:
    """Write a bench's result to bench-results/filename and print it, a line a figure."""
    OUT.mkdir(exist_ok=True)
    (OUT / filename).write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:36} {json.dumps(value) if isinstance(value, dict | list) else value}")


def make_topic(headers: dict[str, str]) -> str:
    topic = f"bench{uuid.uuid4().hex[:6]}"
    requests.put(f"{URL}/v1/topics/{topic}", headers=headers, json={"lease_seconds": 60},
                 timeout=30).raise_for_status()
    return topic


def throughput(headers: dict[str, str], count: int, consumers: int) -> dict[str, Any]:
    """Phase 1: count messages due at once (a backlog), then drained by the consumers."""
    topic = make_topic(headers)
    enqueue_rate, sent = enqueue(headers, topic, count, now_ms(), 0)
    received, elapsed = consume(headers, topic, count, consumers, deadline_s=600)
    ids = [r["id"] for r in received if r["id"] in sent]
    return {"enqueue_msgs_per_s": enqueue_rate,
            "lease_ack_msgs_per_s": len(set(ids)) / elapsed,
            "early": sum(1 for r in received if r["at"] < r["due"]),
            "lost": len(sent - set(ids)), "duplicates": len(ids) - len(set(ids))}


def steady_lag(headers: dict[str, str], count: int, consumers: int, rate: int) -> dict[str, Any]:
    """Phase 2: consumers already polling; count messages come due at `rate` per second,
    starting once they are all written. Lag = receive time - deliver_at."""
    topic = make_topic(headers)
    outcome: dict[str, Any] = {}

    def run_consumers() -> None:
        outcome["received"], _ = consume(headers, topic, count, consumers, deadline_s=600)

    polling = threading.Thread(target=run_consumers)
    polling.start()
    head_start_ms = 3000 + count // 2  # room for the enqueue at >= 2,000 msgs/s
    first_due = now_ms() + head_start_ms
    _, sent = enqueue(headers, topic, count, first_due, count * 1000 // rate)
    time.sleep(max(0, first_due - now_ms()) / 1000)
    busy_before, stack_before, began = cpu_ticks(), stack_cpu_s(), time.monotonic()
    polling.join()
    busy = busy_share(busy_before, cpu_ticks())
    elapsed = time.monotonic() - began
    cores = {k: round((v - stack_before[k]) / elapsed, 3) for k, v in stack_cpu_s().items()}
    received = outcome["received"]
    lags = [r["at"] - r["due"] for r in received]
    ids = [r["id"] for r in received if r["id"] in sent]
    # a message due while its call waited measures the server; one due before its call was
    # made measures the consumers' own cycle (acks, the next call) as well
    waited = [r["at"] - r["due"] for r in received if r["asked"] <= r["due"]]
    calls = len({r["call"] for r in received})
    return {"rate_per_s": rate,
            "lag_ms": {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
                       "max": max(lags, default=0),
                       "mean": statistics.fmean(lags) if lags else 0},
            "calls_per_s": round(calls / elapsed, 1),
            "messages_per_call": round(len(received) / calls, 2) if calls else 0,
            "to_a_waiting_call": {"share": round(len(waited) / len(lags), 3) if lags else 0,
                                  "p50": percentile(waited, 0.5),
                                  "p99": percentile(waited, 0.99)},
            "machine_busy": round(busy, 3), "cores": cores,
            "early": sum(1 for lag in lags if lag < 0),
            "lost": len(sent - set(ids)), "duplicates": len(ids) - len(set(ids))}


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (/proc/stat):
    the stack, its client and anything else running."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def stack_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by the API (gunicorn master and workers), the releaser (with
    its POST process) and the Cassandra node `make up` started."""
    return {"api": sum(cpu_s(p) for p in api_pids()),
            "releaser": sum(cpu_s(p) for p in process_tree(releaser_pid())),
            "cassandra": cpu_s(cassandra_pid())}


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share (0 to 1) of all the machine's cores that was busy between two cpu_ticks()."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0


def quiet_lag(headers: dict[str, str], count: int = 200, gap_ms: int = 50) -> dict[str, Any]:
    """Phase 3: one consumer already polling; count messages due gap_ms apart."""
    return steady_lag(headers, count, 1, 1000 // gap_ms)


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 20_000
    consumers = int(argv[1]) if len(argv) > 1 else 8
    rate = int(argv[2]) if len(argv) > 2 else 1000
    headers = dev_headers()
    speed = SpeedTrack()
    result: dict[str, Any] = {"messages": count, "consumers": consumers,
                              "backlog": throughput(headers, count, consumers),
                              "steady": steady_lag(headers, count, consumers, rate),
                              "steady_light": steady_lag(headers, count * LIGHT // 100,
                                                         consumers, rate * LIGHT // 100),
                              "quiet": quiet_lag(headers),
                              "quiet_floor": take_floor(),
                              **raw_ceiling(count)}
    backlog = result["backlog"]
    result["enqueue_vs_raw_insert"] = backlog["enqueue_msgs_per_s"] / result[
        "raw_insert_rows_per_s"]
    result["lease_ack_vs_raw_lwt_pairs"] = backlog["lease_ack_msgs_per_s"] / (
        result["raw_lwt_per_s"] / 2)
    result["quiet_p99_vs_floor_p99"] = result["quiet"]["lag_ms"]["p99"] / result[
        "quiet_floor"]["pointer_and_lwt_ms"]["p99"]
    result["machine_loop_ms"] = speed.result()
    OUT.mkdir(exist_ok=True)
    (OUT / "bench.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:28} {json.dumps(value) if isinstance(value, dict) else round(value, 3)}")
    clean = all(result[phase][k] == 0 for phase in ("backlog", "steady", "steady_light", "quiet")
                for k in ("early", "lost"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
