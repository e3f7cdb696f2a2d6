"""`make bench` (many topics): what T topics of K tenants (default 10,000 of 100) cost an idle
stack, and whether a topic created among them is on time.

Against the running stack (`make up`: the API and one releaser):
1. the releaser's CPU (utime + stime from /proc) over 20 s before the topics exist;
2. create T drained topics (every tenth a webhook topic) across K tenants, 8 threads;
3. the releaser's CPU over 20 s with all of them (nothing due anywhere), from 30 s after the
   last was created (its walk of each new topic has begun);
4. twenty times: create a webhook topic and at once enqueue one message due 200 ms later;
   its lag at the target (arrival - deliver_at), p50/p99/max, and none early; then the same
   with a pull topic and a consumer long-polling it from the moment it exists (lag: the
   answer's arrival - deliver_at);
5. the releaser's CPU and Cassandra requests a second over 30 s from LATER_AT_S after the
   last topic was created (minutes later);
6. delete every topic made, and revoke the tenants' keys.
Writes bench-results/topics.json and prints a table. Usage:
python -m tests.bench.topics [T] [K]
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
import uuid
from typing import Any

import requests

from app.config import load_config
from app.core.timeparse import parse_instant
from app.services import Services
from tests.bench.idle import measure
from tests.bench.run import OUT, URL, cpu_s, percentile, releaser_pid, timed_threads
from tests.receiver import Receiver, receiving

THREADS = 8
NEW_TOPICS = 20
LATER_AT_S = 330
LATER_S = 30


def releaser_cores(pid: int, seconds: float = 20) -> float:
    before, began = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - before) / (time.monotonic() - began)


def make_topics(keys: list[str], count: int, target: str) -> tuple[float, list[tuple[str, str]]]:
    """count topics spread over the tenants of `keys`; (seconds, [(key, topic name)])."""
    made = [(keys[n % len(keys)], f"many{n}") for n in range(count)]

    def work(mine: list[tuple[str, str]]) -> None:
        session = requests.Session()
        for n, (key, name) in enumerate(mine):
            body: dict[str, Any] = {}
            if n % 10 == 0:
                body = {"delivery": {"mode": "webhook", "url": target}}
            session.put(f"{URL}/v1/topics/{name}", headers=_auth(key), json=body,
                        timeout=60).raise_for_status()

    seconds = timed_threads([functools.partial(work, made[k::THREADS]) for k in range(THREADS)])
    return seconds, made


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_topic_lags(key: str, receiver: Receiver) -> list[int]:
    """Lag (ms) of a message due 200 ms after its webhook topic was created, NEW_TOPICS times."""
    session = requests.Session()
    for n in range(NEW_TOPICS):
        name = f"fresh{uuid.uuid4().hex[:6]}"
        session.put(f"{URL}/v1/topics/{name}", headers=_auth(key), timeout=60, json={
            "delivery": {"mode": "webhook", "url": receiver.url}}).raise_for_status()
        session.post(f"{URL}/v1/topics/{name}/messages", headers=_auth(key), timeout=60,
                     json={"id": f"new{n}", "delay_ms": 200, "payload": n}).raise_for_status()
        receiver.wait_for(lambda got, n=n: any(a.message_id == f"new{n}" for a in got), 30)
        session.delete(f"{URL}/v1/topics/{name}", headers=_auth(key), timeout=60)
    return [a.received_ms - parse_instant(a.headers["Duetime-Deliver-At"])
            for a in receiver.arrivals if a.message_id.startswith("new")]


def long_poll(url: str, key: str, out: list[tuple[int, list[dict[str, Any]]]]) -> None:
    """One lease call of `max: 1` waiting up to 5 s; appends (answered at ms, messages)."""
    answer = requests.post(f"{url}/leases", headers=_auth(key), timeout=60,
                           json={"max": 1, "wait_ms": 5000})
    answer.raise_for_status()
    out.append((int(time.time() * 1000), answer.json()["messages"]))


def new_pull_topic_lags(key: str) -> list[int]:
    """Lag (ms) of a message due 200 ms after its pull topic was created, to a consumer
    long-polling since the topic exists, NEW_TOPICS times."""
    session = requests.Session()
    answers: list[tuple[int, list[dict[str, Any]]]] = []
    for n in range(NEW_TOPICS):
        url = f"{URL}/v1/topics/freshpull{uuid.uuid4().hex[:6]}"
        session.put(url, headers=_auth(key), timeout=60, json={}).raise_for_status()
        consumer = threading.Thread(target=long_poll, args=(url, key, answers))
        consumer.start()
        session.post(f"{url}/messages", headers=_auth(key), timeout=60,
                     json={"id": f"pull{n}", "delay_ms": 200, "payload": n}).raise_for_status()
        consumer.join()
        session.delete(url, headers=_auth(key), timeout=60)
    return [received_ms - parse_instant(m["deliver_at"])
            for received_ms, messages in answers for m in messages]


def _lag_summary(lags: list[int]) -> dict[str, int]:
    return {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
            "max": max(lags, default=0), "early": sum(1 for x in lags if x < 0),
            "delivered": len(lags)}


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 10_000
    tenants = int(argv[1]) if len(argv) > 1 else 100
    pid = releaser_pid()
    services = Services(load_config())
    names = [f"many{uuid.uuid4().hex[:6]}" for _ in range(tenants)]
    keys = [services.keys.create(tenant) for tenant in names]
    before = releaser_cores(pid)
    with receiving(Receiver()) as receiver:
        created_s, made = make_topics(keys, count, receiver.url)
        created_at = time.monotonic()
        time.sleep(30)  # the releaser has followed every change and swept every topic once
        after = releaser_cores(pid)
        lags = new_topic_lags(keys[0], receiver)
        pull_lags = new_pull_topic_lags(keys[0])
        time.sleep(max(0.0, created_at + LATER_AT_S - time.monotonic()))
        later = measure(LATER_S)
    for key, name in made:
        requests.delete(f"{URL}/v1/topics/{name}", headers=_auth(key), timeout=60)
    for info in services.keys.all():
        if info.tenant in names:
            services.keys.revoke(info.key_id)
    services.close()
    result: dict[str, Any] = {
        "topics": count, "tenants": tenants, "create_topics_per_s": round(count / created_s, 1),
        "idle_releaser_cores_before": round(before, 3),
        "idle_releaser_cores_with_topics": round(after, 3),
        f"idle_releaser_{LATER_AT_S}s_after": {
            "cores": later["cores"]["releaser"],
            "cassandra_requests_per_s": later["cassandra_requests_per_s"]["releaser"]},
        "new_topic_lag_ms": _lag_summary(lags),
        "new_pull_topic_lag_ms": _lag_summary(pull_lags)}
    OUT.mkdir(exist_ok=True)
    (OUT / "topics.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name:32} {json.dumps(value) if isinstance(value, dict) else value}")
    return 0 if all(len(x) == NEW_TOPICS and min(x) >= 0 for x in (lags, pull_lags)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
