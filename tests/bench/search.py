"""`make bench-search`: finding messages of a large topic (GET /v1/topics/{topic}/messages).

1. In a keyspace of its own (duetime_bench_search), an API (gunicorn, 2 workers) and a topic
   of N messages (default 1,000,000; the first argument), enqueued by HTTP batches of 1,000:
   recipient r<i mod N/10> (10 messages each), labels wave: w<i mod 100> (1 % of the topic
   each) and tier, due over the 2 hours after the next. A topic already loaded with N
   messages by an earlier run is reused.
2. The first page of 100 of 200 searches each, p50/p99/max in ms: by label, by recipient,
   and by label and state together; beside each, the same CQL query straight through the
   driver (the ceiling: what Cassandra's indexes take without the API).
3. What the indexes cost a write: rows/s of conditional batches (60 rows a partition, the
   shape of a take) on a copy of message_states with its six indexes and on one without.
Writes bench-results/search.json and prints it. Usage: python -m tests.bench.search [N]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import sys
import time
import uuid
from typing import Any

import requests

from app.config import load_config
from app.models import MessageFilter
from app.services import Services
from app.store import migrations
from app.store.search import SearchStore
from app.store.session import CassandraSession
from tests.bench.run import OUT, now_ms, percentile, timed_threads
from tests.serving import serving

KEYSPACE = "duetime_bench_search"
PORT = 8097
TOPIC = "search"
CALLS = 200
PRODUCERS = 4
HOUR_MS = 3_600_000
ROWS_PER_HOME = 60
INDEXED = ("topic_uid", "state", "campaign", "recipient", "ENTRIES(labels)", "deliver_at")


def message(i: int, count: int, start: int) -> dict[str, Any]:
    return {"payload": {"i": i}, "deliver_at": start + i * 2 * HOUR_MS // count,
            "recipient": f"r{i % max(1, count // 10)}",
            "labels": {"wave": f"w{i % 100}", "tier": "gold" if i % 7 == 0 else "free"}}


def load(base: str, headers: dict[str, str], count: int) -> float:
    """Enqueue count messages from PRODUCERS threads; msgs/s."""
    start = now_ms() + HOUR_MS

    def produce(firsts: list[int]) -> None:
        session = requests.Session()
        for first in firsts:
            batch = [message(i, count, start) for i in range(first, min(count, first + 1000))]
            answer = session.post(f"{base}/v1/topics/{TOPIC}/messages:batch", headers=headers,
                                  json={"messages": batch}, timeout=120)
            answer.raise_for_status()
            if any(r["status"] != 201 for r in answer.json()["results"]):
                raise SystemExit(f"enqueue failed: {answer.json()['results'][:3]}")

    firsts = list(range(0, count, 1000))
    seconds = timed_threads([functools.partial(produce, firsts[n::PRODUCERS])
                             for n in range(PRODUCERS)])
    return count / seconds


def timed(call: Any, calls: int = CALLS) -> dict[str, float]:
    took = []
    for n in range(calls):
        began = time.perf_counter()
        call(n)
        took.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": round(percentile(took, 0.5), 1), "p99_ms": round(percentile(took, 0.99), 1),
            "max_ms": round(max(took), 1)}


def searches(base: str, headers: dict[str, str], store: SearchStore, uid: uuid.UUID,
             count: int) -> dict[str, Any]:
    """Per kind of search: the API's first page of 100, and the driver's (the ceiling)."""
    rng = random.Random(7)
    recipients = max(1, count // 10)
    kinds = {
        "label": lambda: {"label": f"wave:w{rng.randrange(100)}"},
        "recipient": lambda: {"recipient": f"r{rng.randrange(recipients)}"},
        "label_and_state": lambda: {"label": f"wave:w{rng.randrange(100)}",
                                    "state": "scheduled"},
    }
    session = requests.Session()
    result: dict[str, Any] = {}
    for kind, query in kinds.items():
        found: list[int] = []

        def api(_: int, query: Any = query, found: list[int] = found) -> None:
            answer = session.get(f"{base}/v1/topics/{TOPIC}/messages", headers=headers,
                                 params={**query(), "limit": 100}, timeout=30)
            answer.raise_for_status()
            found.append(len(answer.json()["messages"]))

        def driver(_: int, query: Any = query) -> None:
            q = query()
            labels = (tuple(q["label"].split(":", 1)),) if "label" in q else ()
            store.find(uid, MessageFilter(state=q.get("state"), recipient=q.get("recipient"),
                                          labels=labels), 100)

        result[kind] = {"api": timed(api), "driver": timed(driver),
                        "found_per_page": round(sum(found) / len(found), 1)}
    return result


def index_write_cost(db: CassandraSession, rows: int = 60_000) -> dict[str, float]:
    """Rows/s of conditional batches of ROWS_PER_HOME rows a partition (what a take or an
    ack sends per home) rewriting state, labels and the other indexed columns, on a table
    shaped like message_states with its six storage-attached indexes and on one without."""
    rates = {}
    for name, indexed in (("without_indexes", False), ("with_indexes", True)):
        table = f"bench_states_{name}"
        db.execute_raw(f"DROP TABLE IF EXISTS {{ks}}.{table}")
        db.execute_raw(f"CREATE TABLE {{ks}}.{table} (topic_uid uuid, home int, id text, "
                       "state text, version int, campaign text, recipient text, "
                       "labels map<text, text>, deliver_at timestamp, "
                       "PRIMARY KEY ((topic_uid, home), id))")
        for n, column in enumerate(INDEXED if indexed else ()):
            db.execute_raw(f"CREATE CUSTOM INDEX {table}_{n} ON {{ks}}.{table} ({column}) "
                           "USING 'StorageAttachedIndex'")
        uid = uuid.uuid4()
        homes = [[(uid, h, f"m{i}") for i in range(ROWS_PER_HOME)]
                 for h in range(rows // ROWS_PER_HOME)]
        values = "state = ?, campaign = 'c', recipient = ?, labels = labels + ?, deliver_at = ?"
        db.execute_batches(f"UPDATE {{ks}}.{table} SET version = 1, {values} "
                           "WHERE topic_uid = ? AND home = ? AND id = ?",
                           [[("scheduled", f"r{h}", {"wave": "w1"}, 0, *key) for key in home]
                            for h, home in enumerate(homes)])
        began = time.perf_counter()
        db.execute_batches(f"UPDATE {{ks}}.{table} SET version = 2, {values} "
                           "WHERE topic_uid = ? AND home = ? AND id = ? IF version = 1",
                           [[("leased", f"r{h}", {"wave": "w1"}, 0, *key) for key in home]
                            for h, home in enumerate(homes)])
        rates[name] = round(rows / (time.perf_counter() - began))
        db.execute_raw(f"DROP TABLE {{ks}}.{table}")
    rates["ratio"] = round(rates["with_indexes"] / rates["without_indexes"], 3)
    return rates


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 1_000_000
    config = dataclasses.replace(load_config(), keyspace=KEYSPACE)
    services = Services(config)
    migrations.apply(services.db)
    headers = {"Authorization": f"Bearer {services.keys.create('bench-search')}"}
    with serving(KEYSPACE, PORT, DUETIME_WEB_WORKERS="2") as base:
        requests.put(f"{base}/v1/topics/{TOPIC}", headers=headers, json={},
                     timeout=30).raise_for_status()
        topic = services.topics.get("bench-search", TOPIC)
        assert topic is not None
        have = SearchStore(services.db).find(topic.uid, MessageFilter(), 1)
        counted = services.counts.states(topic.uid).get("scheduled", 0) if have.rows else 0
        rate = None
        if abs(counted - count) > count // 1000:  # counters may be off by a flush
            if have.rows:
                raise SystemExit(f"topic {TOPIC} of {KEYSPACE} holds {counted} messages, not "
                                 f"{count}: drop the keyspace or ask for {counted}")
            rate = round(load(base, headers, count))
        result = {"messages": count, "enqueue_msgs_per_s": rate,
                  "searches": searches(base, headers, SearchStore(services.db), topic.uid,
                                       count),
                  "index_write_cost": index_write_cost(services.db)}
    services.close()
    OUT.mkdir(exist_ok=True)
    (OUT / "search.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
