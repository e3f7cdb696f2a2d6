"""First messages of new topics, webhook and pull, against the stack of `make up`.

Each round makes a webhook topic and a pull topic a moment ago, then enqueues 100 messages to
each (one batch) due from LEAD_MS after the enqueue on, 10 ms apart. The webhook topic's are
POSTed by the stack's releaser to a local receiver; the pull topic's are taken by CONSUMERS
threads long-polling it (`max` 10, `wait_ms` 5000) from before the enqueue. Lag is receive
time - deliver_at (the same machine's clock). Reports per mode p50/p99/max over all
messages, the worst round's max, how many rounds had a message more than 100 ms late, and
early (must be 0), lost and duplicated.
Usage: python -m tests.bench.new_topics [ROUNDS] [MESSAGES]
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

import requests
from duetime_client.client import Client

from app.core.timeparse import parse_instant
from tests.bench.run import OUT, URL, dev_headers, now_ms, percentile
from tests.receiver import Receiver, receiving

LEAD_MS = 2000
GAP_MS = 10
CONSUMERS = 4
LATE_MS = 100


def _enqueue(headers: dict[str, str], topic: str, count: int) -> int:
    """Enqueue count messages due from LEAD_MS on; the first due time (epoch ms)."""
    first = now_ms() + LEAD_MS
    answer = requests.post(f"{URL}/v1/topics/{topic}/messages:batch", headers=headers,
                           timeout=60, json={"messages": [
                               {"payload": {"n": n}, "deliver_at": first + n * GAP_MS}
                               for n in range(count)]})
    answer.raise_for_status()
    if any(r["status"] != 201 for r in answer.json()["results"]):
        raise SystemExit("enqueue failed")
    return first


def webhook_round(headers: dict[str, str], target: Receiver, url: str,
                  count: int) -> list[tuple[str, int]]:
    """(id, lag ms) of each POST of a new webhook topic's first `count` messages."""
    topic = f"nw{uuid.uuid4().hex[:8]}"
    requests.put(f"{URL}/v1/topics/{topic}", headers=headers, timeout=30, json={
        "delivery": {"mode": "webhook", "url": url}}).raise_for_status()
    seen = len(target.arrivals)
    _enqueue(headers, topic, count)
    target.wait_for(lambda arrivals: len({a.message_id for a in arrivals[seen:]}) >= count,
                    LEAD_MS / 1000 + count * GAP_MS / 1000 + 30)
    arrivals = list(target.arrivals)[seen:]
    requests.delete(f"{URL}/v1/topics/{topic}", headers=headers, timeout=30)
    return [(a.message_id, a.received_ms - parse_instant(a.headers["Duetime-Deliver-At"]))
            for a in arrivals]


def pull_round(api: Client, headers: dict[str, str], count: int) -> list[tuple[str, int]]:
    """(id, lag ms) of each lease of a new pull topic's first `count` messages."""
    topic = f"np{uuid.uuid4().hex[:8]}"
    api.put_topic(topic, lease_seconds=60)
    got: list[tuple[str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            leased = api.lease(topic, 10, 5000)
            received = now_ms()  # all of them, before the acks of the first
            for m in leased:
                with lock:
                    got.append((m["id"], received - parse_instant(m["deliver_at"])))
                api.ack(topic, m)

    threads = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # the consumers wait before the messages are written
    _enqueue(headers, topic, count)
    deadline = time.monotonic() + LEAD_MS / 1000 + count * GAP_MS / 1000 + 30
    while time.monotonic() < deadline:
        with lock:
            if len({i for i, _ in got}) >= count:
                break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(10)
    api.delete_topic(topic)
    return got


def summary(rounds: list[list[tuple[str, int]]], count: int) -> dict[str, Any]:
    lags = [lag for r in rounds for _, lag in r]
    ids = [(n, i) for n, r in enumerate(rounds) for i, _ in r]
    dups = sum(k - 1 for k in Counter(ids).values())
    return {"rounds": len(rounds), "messages": len(lags),
            "lag_ms": {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
                       "max": max(lags, default=0)},
            "rounds_with_a_message_over_100_ms": sum(
                1 for r in rounds if any(lag > LATE_MS for _, lag in r)),
            "round_max_ms": sorted(max((lag for _, lag in r), default=0) for r in rounds),
            "early": sum(1 for lag in lags if lag < 0),
            "lost": len(rounds) * count - len(set(ids)), "duplicates": dups}


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 50
    count = int(argv[1]) if len(argv) > 1 else 100
    headers = dev_headers()
    api = Client(URL, headers["Authorization"].split()[1], timeout_s=60, retries=0,
                 connections=CONSUMERS + 2)
    webhook: list[list[tuple[str, int]]] = []
    pull: list[list[tuple[str, int]]] = []
    with receiving(Receiver()) as target:
        for _ in range(rounds):
            webhook.append(webhook_round(headers, target, target.url, count))
            pull.append(pull_round(api, headers, count))
    result: dict[str, Any] = {"lead_ms": LEAD_MS, "webhook": summary(webhook, count),
              "pull": summary(pull, count)}
    OUT.mkdir(exist_ok=True)
    (OUT / "new_topics.json").write_text(json.dumps(result, indent=2))
    for mode in ("webhook", "pull"):
        found = result[mode]
        print(f"{mode:8} " + json.dumps({k: v for k, v in found.items() if k != "round_max_ms"}))
        print(f"{'':8} round max ms: {found['round_max_ms']}")
    return 1 if any(result[m]["early"] or result[m]["lost"] for m in ("webhook", "pull")) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
