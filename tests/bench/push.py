"""Release accuracy of webhook push (issue 4's benchmark), against the stack of `make up`.

20,000 messages due over 20 s, 5,000 of them due within one second (the burst), POSTed by the
stack's releaser to a local receiver. Reports lag (receive time - deliver_at) p50/p99/max,
early (must be 0), lost, duplicates; optionally with a backlog of messages scheduled a month
ahead in the same topic (--topic, loaded by `python -m tests.bench.spark_import --topic T`),
to show the backlog does not slow what is due now. In the same run, the raw POST ceiling:
the same receiver fed by the releaser's HTTP client, 64 POSTs at a time, with no Cassandra, so
the delivery rate reads as a ratio of what the machine's HTTP round trip allows.
Usage: python -m tests.bench.push [--messages N] [--topic T] [--label NAME] [--client-ids]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from typing import Any

import requests

from app.core.timeparse import parse_instant
from app.delivery import signing
from app.delivery.webhook_targets import parse_allow
from tests.bench.plot import lag_by_second
from tests.bench.run import OUT, URL, dev_headers, now_ms, percentile
from tests.loop_thread import LoopThread
from tests.receiver import Receiver, receiving
from workers.http_client import AsyncHttpClient

LOOPBACK = "127.0.0.0/8,::1"

SPAN_MS = 20_000
BURST = 5_000
BURST_AT_MS = 10_000


def due_offsets(count: int, seed: int = 7) -> list[int]:
    """Offsets (ms from the start) of `count` messages: BURST of them spread over the one
    second at BURST_AT_MS, the rest uniform over SPAN_MS."""
    rng = random.Random(seed)
    burst = min(BURST, count // 4)
    spread = [rng.randrange(SPAN_MS) for _ in range(count - burst)]
    return sorted(spread + [BURST_AT_MS + rng.randrange(1000) for _ in range(burst)])


def enqueue_all(headers: dict[str, str], topic: str, dues: list[int], client_ids: bool) -> float:
    """Enqueue in batches of 1,000 with server-made ids (or client ids); msgs/s."""
    run = uuid.uuid4().hex[:6]  # a topic may be measured more than once
    began = time.perf_counter()
    for first in range(0, len(dues), 1000):
        batch = [{"payload": {"i": i}, "deliver_at": dues[i]}
                 | ({"id": f"p{run}-{i}"} if client_ids else {})
                 for i in range(first, min(len(dues), first + 1000))]
        answer = requests.post(f"{URL}/v1/topics/{topic}/messages:batch", headers=headers,
                               json={"messages": batch}, timeout=300)
        answer.raise_for_status()
        if any(r["status"] != 201 for r in answer.json()["results"]):
            raise SystemExit("enqueue failed")
    return len(dues) / (time.perf_counter() - began)


def measure(headers: dict[str, str], count: int, topic: str | None,
            client_ids: bool) -> dict[str, Any]:
    with receiving(Receiver()) as target:
        topic = topic or f"push{uuid.uuid4().hex[:6]}"
        requests.put(f"{URL}/v1/topics/{topic}", headers=headers, timeout=30, json={
            "delivery": {"mode": "webhook", "url": target.url}}).raise_for_status()
        # start far enough ahead that every message is written before the first is due
        start = now_ms() + 10_000 + count * 3
        rate = enqueue_all(headers, topic, [start + d for d in due_offsets(count)], client_ids)
        if now_ms() > start:
            raise SystemExit("enqueue took longer than the head start; lower --messages")
        target.wait_distinct(count, (start - now_ms() + SPAN_MS) / 1000 + 60)
        arrivals = list(target.arrivals)
    dues = [parse_instant(a.headers["Duetime-Deliver-At"]) for a in arrivals]
    lags = [a.received_ms - due for a, due in zip(arrivals, dues, strict=True)]
    ids = [a.message_id for a in arrivals]
    by_second: dict[int, list[int]] = {}
    for due, lag in zip(dues, lags, strict=True):
        by_second.setdefault((due - start) // 1000, []).append(lag)
    return {
        "topic": topic, "messages": count, "burst": min(BURST, count // 4),
        "ids": "client" if client_ids else "server",
        "enqueue_msgs_per_s": rate,
        "lag_ms": {"p50": percentile(lags, 0.5), "p90": percentile(lags, 0.9),
                   "p99": percentile(lags, 0.99), "max": max(lags, default=0)},
        "early": sum(1 for lag in lags if lag < 0),
        "lost": count - len(set(ids)), "duplicates": len(ids) - len(set(ids)),
        "lag_by_due_second": [
            {"second": sec, "messages": len(v), "p50": percentile(v, 0.5),
             "p99": percentile(v, 0.99), "max": max(v)} for sec, v in sorted(by_second.items())],
    }


def post_ceiling(count: int, concurrency: int) -> float:
    """The same receiver's raw capacity on this machine: POSTs/s of `count` signed message-sized
    bodies, `concurrency` at a time over keep-alive connections, from the releaser's own HTTP
    client (workers.http_client) on its own event loop; no Cassandra."""
    body = json.dumps({"i": 1}).encode()
    runner = LoopThread("ceiling")
    client = AsyncHttpClient(parse_allow(LOOPBACK))  # the receiver is local

    async def post_all(url: str) -> None:
        async def post(n: int) -> None:
            for i in range(n, count, concurrency):
                status, _ = await client.post(url, body, {
                    "Content-Type": "application/json", "Duetime-Message-Id": f"c{i}",
                    "Duetime-Deliver-At": "2026-01-01T00:00:00.000Z",
                    "Duetime-Signature": signing.body_signature("s" * 32, body),
                    "webhook-id": f"c{i}", "webhook-timestamp": "1767225600",
                    "webhook-signature": signing.standard_signature(
                        ["s" * 32], f"c{i}", 1767225600, body)}, 10)
                if status != 200:
                    raise SystemExit(f"the receiver answered {status}")

        await asyncio.gather(*(post(n) for n in range(concurrency)))
        client.close()

    with receiving(Receiver()) as target:
        began = time.perf_counter()
        runner.run(post_all(target.url))
        elapsed = time.perf_counter() - began
    runner.stop()
    return count / elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.push")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--label", default="push")
    parser.add_argument("--topic", default=None, help="use this topic (made a webhook topic), "
                        "e.g. one holding a backlog imported by tests.bench.spark_import")
    parser.add_argument("--client-ids", action="store_true",
                        help="give every message a client id (homes by hash) instead of "
                        "server-made ids (one home per request and shard)")
    args = parser.parse_args(argv)
    headers = dev_headers()
    result = measure(headers, args.messages, args.topic, args.client_ids)
    result["raw_post_ceiling_per_s"] = post_ceiling(20_000, 64)
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.label}.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        if name != "lag_by_due_second":
            print(f"{name:22} {value if isinstance(value, str | int) else json.dumps(value)}")
    chart = lag_by_second(OUT / f"{args.label}.png", f"push lag per due second: {args.label} "
                          f"({args.messages:,} messages)", result["lag_by_due_second"])
    if chart is not None:
        print(f"chart                  {chart}")
    print("due second   messages   p50 ms   p99 ms   max ms")
    for row in result["lag_by_due_second"]:
        print(f"{row['second']:>10} {row['messages']:>10} {row['p50']:>8.0f} {row['p99']:>8.0f} "
              f"{row['max']:>8}")
    return 0 if result["early"] == 0 and result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
