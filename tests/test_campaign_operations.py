"""Campaign operations at size on the real node: a cancel of 20,000 messages (100,000 under
`make long`) while pull consumers drain the campaign, and an operation whose process is
SIGKILLed mid-way and is finished by another. Counts are checked against the rows: exactly,
but for the one page a killed runner was applying (workers/operations.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from flask import Flask

from app.config import Config
from app.core.timeline import CAMPAIGN_SPREAD
from app.services import Services
from tests.campaign_helpers import (
    campaign,
    operation,
    rows_of,
    running_operations,
    states_of,
    topic_uid,
    wait_operation,
)
from tests.conftest import ROOT
from tests.consumers import TopicClient, now_ms
from tests.scale import scaled
from workers.operations import PER_SPREAD

BIG = scaled(20_000, 100_000)
SPREAD_MS = 30_000  # BIG messages are due over this long


def _enqueue(topic: TopicClient, name: str, count: int, first_due_ms: int,
             step_us: int) -> None:
    for start in range(0, count, 1000):
        results = topic.batch([{"campaign": name, "payload": n,
                                "deliver_at": first_due_ms + n * step_us // 1000}
                               for n in range(start, min(count, start + 1000))])
        assert {r["status"] for r in results} == {201}


@pytest.mark.long_form
def test_cancel_of_a_big_campaign_while_consumers_drain_it(
        app: Flask, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, lease_seconds=60)
    # due from 20 s after the start over 30 s: consumers drain what is due as the cancel runs
    _enqueue(topic, "big", BIG, now_ms() + 20_000, SPREAD_MS * 1000 // BIG)
    acked: set[str] = set()
    refused: list[int] = []
    stop = threading.Event()
    lock = threading.Lock()

    def consume() -> None:
        mine = TopicClient(app.test_client(), auth, name=topic.name)
        while not stop.is_set():
            got = mine.lease(100, wait_ms=200)
            if not got:
                continue
            answer = mine.client.post(mine.url("/acks"), headers=auth, json={"acks": [
                {"id": m["id"], "lease_token": m["lease"]["token"]} for m in got]})
            with lock:
                for r in answer.get_json()["results"]:
                    if r["status"] == 204:
                        acked.add(r["id"])
                    else:
                        refused.append(r["status"])

    consumers = [threading.Thread(target=consume) for _ in range(4)]
    for c in consumers:
        c.start()
    try:
        while len(acked) < 2000:  # delivery is under way
            time.sleep(0.05)
        with running_operations(services):
            answer = topic.client.delete(topic.url("/campaigns/big"), headers=auth)
            assert answer.status_code == 202
            op_id = answer.get_json()["operation"]["id"]
            seen: list[dict[str, Any]] = []
            while (op := operation(topic.client, topic, op_id))["state"] == "running":
                seen.append(op)
                time.sleep(0.5)
        time.sleep(2)  # leases taken before the cancel reached them: acked or refused
    finally:
        stop.set()
        for c in consumers:
            c.join()
    assert op["state"] == "succeeded" and op["processed"] == BIG, op
    assert any(0 < s["processed"] < BIG for s in seen), "no progress was visible while running"
    rows = rows_of(services, topic_uid(services, auth, topic.name), "big")
    delivered = {r.id for r in rows if r.state == "delivered"}
    cancelled = {r.id for r in rows if r.state == "cancelled"}
    assert len(rows) == BIG and len(delivered) + len(cancelled) == BIG
    assert delivered == acked  # nothing cancelled was delivered, nothing delivered was lost
    assert len(cancelled) >= op["changed"] > 0 and len(delivered) >= 2000
    assert set(refused) <= {409}  # acks of leases the cancel took back
    view = campaign(topic, "big")
    assert view["counts"] == {"scheduled": 0, "paused": 0, "leased": 0, "delivered": len(delivered),
                              "cancelled": len(cancelled), "dead": 0}
    assert view["cancelled"] is True and view["operation"] is None


def test_an_operation_whose_process_is_killed_is_finished_by_another(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    count = 40_000
    _enqueue(topic, "victim", count, now_ms() + 3_600_000, 1000)
    answer = topic.client.delete(topic.url("/campaigns/victim"), headers=auth)
    op_id = answer.get_json()["operation"]["id"]
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace, "DUETIME_RELEASE_RING": "4242"}
    runner = subprocess.Popen([sys.executable, "-m", "app.cli", "releaser", "--member", "victim"],
                              cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while operation(topic.client, topic, op_id)["processed"] == 0:
            assert time.monotonic() < deadline and runner.poll() is None
            time.sleep(0.02)
        os.kill(runner.pid, signal.SIGKILL)
    finally:
        runner.kill()
        runner.wait()
    at_kill = operation(topic.client, topic, op_id)
    assert at_kill["state"] == "running" and 0 < at_kill["processed"] < count, at_kill
    # a page's counter moves are written before its checkpoint: every checkpointed one counts
    assert campaign(topic, "victim")["counts"]["cancelled"] >= at_kill["changed"] > 0
    with running_operations(services, "heir"):
        done = wait_operation(topic, op_id, 90)  # once the victim's lease (10 s) has passed
    assert done["state"] == "succeeded"
    assert done["processed"] == count and done["changed"] == count  # each once, none skipped
    truth = states_of(services, topic_uid(services, auth, topic.name), "victim")
    assert truth == {"scheduled": 0, "paused": 0, "leased": 0, "delivered": 0, "cancelled": count,
                     "dead": 0}
    # the heir moves no counter for a row the victim changed in the page it died in (counter
    # writes cannot be repeated safely): the counts may be short by that one page, no more
    counts = campaign(topic, "victim")["counts"]
    short = count - counts["cancelled"]
    assert counts == {**truth, "scheduled": short, "cancelled": count - short}
    assert 0 <= short <= PER_SPREAD * CAMPAIGN_SPREAD
