"""A filtered cancel whose releaser is killed mid-way (SIGKILL) is finished by another runner
with exact counts: every page is checkpointed by its ids before it changes, so the heir
applies the page the victim died in again and counts each message once (this keyspace has no
suite releaser: the victim is the only runner until the heir starts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from flask import Flask

from app.config import Config
from app.services import Services
from tests.campaign_helpers import operation, running_operations, wait_operation
from tests.conftest import ROOT
from tests.consumers import TopicClient, now_ms
from tests.test_filtered_operations import rows, started


def test_a_filtered_cancel_whose_releaser_is_killed_is_finished_by_another(
        app: Flask, config: Config, auth: dict[str, str]) -> None:
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    count, others = 20_000, 500
    due = now_ms() + 3_600_000
    for first in range(0, count + others, 1000):
        assert {r["status"] for r in topic.batch(
            [{"id": f"m{n}", "deliver_at": due,
              "labels": {"batch": "doomed" if n < count else "kept"}}
             for n in range(first, min(count + others, first + 1000))])} == {201}
    op_id = started(topic, kind="cancel", filter={"label": ["batch:doomed"]})["id"]
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace, "DUETIME_RELEASE_RING": "4243"}
    victim = subprocess.Popen([sys.executable, "-m", "app.cli", "releaser", "--member",
                               "victim"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while operation(topic.client, topic, op_id)["processed"] == 0:
            assert time.monotonic() < deadline and victim.poll() is None
            time.sleep(0.02)
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait()
    at_kill = operation(topic.client, topic, op_id)
    assert at_kill["state"] == "running" and 0 < at_kill["processed"] < count, at_kill
    with running_operations(services, "heir"):
        done = wait_operation(topic, op_id, 60)  # once the victim's lease (10 s) has passed
    assert done["state"] == "succeeded", done
    assert done["processed"] == count and done["changed"] == count  # each once, none skipped
    found = rows(services, topic)
    assert sum(r.state == "cancelled" for r in found.values()) == count
    assert all(found[f"m{n}"].state == "scheduled" for n in range(count, count + others))
