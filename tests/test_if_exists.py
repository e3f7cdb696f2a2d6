"""if_exists on enqueue (openapi.yaml, MessageIn): reject, replace (debounce a pending
message by its id) and keep (the first one wins), alone and in batches, and replaces racing
delivery: every message is handed out with one whole version, never early for it."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from flask.testing import FlaskClient

from app.config import Config
from app.core.timeparse import parse_instant
from tests.campaign_helpers import campaign
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving
from tests.releasing import webhook_topic
from tests.waiting import wait_until


def stats(topic: TopicClient) -> Any:
    answer = topic.client.get(topic.url("/stats"), headers=topic.headers)
    assert answer.status_code == 200
    return answer.get_json()


def upcoming_at(topic: TopicClient, at_ms: int) -> int:
    """The scheduled load /stats shows for the minute holding at_ms."""
    return sum(w["count"] for w in stats(topic)["upcoming"]
               if parse_instant(w["from"]) <= at_ms < parse_instant(w["to"]))


def test_replace_moves_a_scheduled_message_and_its_counts_keep_and_reject_do_not(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    first = now_ms() + 5 * 60_000
    later = first + 20 * 60_000
    made = topic.enqueue(id="remind", deliver_at=first, payload={"v": 1}, campaign="a")
    assert made.status_code == 201
    assert upcoming_at(topic, first) == 1
    # reject (the default): other content is a conflict; the same content a retry
    assert topic.enqueue(id="remind", deliver_at=later, payload={"v": 2}).status_code == 409
    assert topic.enqueue(id="remind", deliver_at=first, payload={"v": 1},
                         campaign="a").status_code == 200
    # keep: the first one wins, whatever the content
    kept = topic.enqueue(id="remind", deliver_at=later, payload={"v": 2}, if_exists="keep")
    assert kept.status_code == 200 and parse_instant(kept.get_json()["deliver_at"]) == first
    # replace: time, payload, priority and campaign become the new ones
    replaced = topic.enqueue(id="remind", deliver_at=later, payload={"v": 2}, priority=7,
                             campaign="b", if_exists="replace")
    assert replaced.status_code == 200, replaced.get_json()
    assert parse_instant(replaced.get_json()["deliver_at"]) == later
    now = topic.get("remind").get_json()
    assert now["payload"] == {"v": 2} and now["priority"] == 7 and now["campaign"] == "b"
    assert parse_instant(now["deliver_at"]) == later and now["state"] == "scheduled"
    assert upcoming_at(topic, first) == 0 and upcoming_at(topic, later) == 1
    assert stats(topic)["counts"]["scheduled"] == 1
    assert campaign(topic, "a")["counts"]["scheduled"] == 0
    assert campaign(topic, "b")["counts"]["scheduled"] == 1
    # the same replace again is a retry: nothing moves
    again = topic.enqueue(id="remind", deliver_at=later, payload={"v": 2}, priority=7,
                          campaign="b", if_exists="replace")
    assert again.status_code == 200 and upcoming_at(topic, later) == 1
    # an unknown id with replace or keep is simply created
    assert topic.enqueue(id="fresh", payload={"v": 1}, if_exists="replace").status_code == 201
    assert topic.enqueue(id="other", payload={"v": 1}, if_exists="keep").status_code == 201


def test_replace_answers_409_once_the_message_is_leased_and_bad_modes_are_400(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    assert topic.enqueue(id="due", payload={"v": 1}).status_code == 201
    [leased] = topic.lease(1)
    late = topic.enqueue(id="due", payload={"v": 2}, if_exists="replace")
    assert late.status_code == 409 and late.content_type == "application/problem+json"
    assert topic.ack(leased) == 204
    assert topic.enqueue(id="due", payload={"v": 3}, if_exists="replace").status_code == 409
    assert topic.get("due").get_json()["payload"] == {"v": 1}
    for bad in ({"id": "x", "if_exists": "overwrite"}, {"if_exists": "replace"}):
        answer = topic.enqueue(**bad)
        assert answer.status_code == 400, answer.get_json()
        assert "if_exists" in answer.get_json()["errors"]


def test_a_batch_replaces_keeps_and_rejects_per_item(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    later = now_ms() + 600_000
    assert {r["status"] for r in topic.batch(
        [{"id": f"b{n}", "payload": {"v": 1}, "delay_ms": 300_000} for n in range(3)])} == {201}
    results = topic.batch([
        {"id": "b0", "payload": {"v": 2}, "deliver_at": later, "if_exists": "replace"},
        {"id": "b1", "payload": {"v": 2}, "deliver_at": later, "if_exists": "keep"},
        {"id": "b2", "payload": {"v": 2}, "deliver_at": later},
        {"id": "b3", "payload": {"v": 2}, "deliver_at": later, "if_exists": "replace"}])
    assert [r["status"] for r in results] == [200, 200, 409, 201]
    assert topic.get("b0").get_json()["payload"] == {"v": 2}
    assert topic.get("b1").get_json()["payload"] == {"v": 1}
    assert topic.get("b2").get_json()["payload"] == {"v": 1}
    assert stats(topic)["counts"]["scheduled"] == 4


def _version(n: int, k: int, at_ms: int) -> dict[str, Any]:
    """Version k of message n: its payload names its own time and campaign, so a hand-out
    that mixed two versions shows it."""
    group = "even" if k % 2 == 0 else "odd"
    return {"id": f"m{n}", "deliver_at": at_ms, "campaign": group, "if_exists": "replace",
            "payload": {"k": k, "at": at_ms, "campaign": group}}


def _replace_while_delivered(topic: TopicClient, messages: int, rounds: int) -> dict[str, int]:
    """Each message enqueued 2 s ahead, then replaced `rounds` times with a time up to 1.5 s
    ahead, from two threads at once: some replaces win, some come after the hand-out (409);
    returns how many replaces each status got."""
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def replacer(seed: int) -> None:
        rng = random.Random(seed)
        for k in range(1, rounds + 1):
            for n in range(seed, messages, 2):
                got = topic.enqueue(**_version(n, k, now_ms() + rng.randint(0, 1500)))
                with lock:
                    statuses[str(got.status_code)] = statuses.get(str(got.status_code), 0) + 1
    for n in range(messages):
        assert topic.enqueue(**_version(n, 0, now_ms() + 2000)).status_code == 201
    threads = [threading.Thread(target=replacer, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(statuses) <= {"200", "409"}, statuses
    return statuses


def test_replaces_racing_pull_consumers_hand_out_whole_versions_never_early(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    handed: list[dict[str, Any]] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for m in topic.lease(5, wait_ms=200):  # checks: never before its deliver_at
                handed.append(m)
                assert topic.ack(m) == 204

    consumers = [threading.Thread(target=consume) for _ in range(4)]
    for c in consumers:
        c.start()
    try:
        statuses = _replace_while_delivered(topic, 50, 10)
        deadline = time.monotonic() + 30
        while len({m["id"] for m in handed}) < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for c in consumers:
            c.join()
    assert statuses.get("200", 0) > 0, statuses
    assert sorted(m["id"] for m in handed) == sorted(f"m{n}" for n in range(50))  # once each
    for m in handed:
        assert m["payload"]["at"] == parse_instant(m["deliver_at"]), m  # one whole version
        assert m["payload"]["campaign"] == m["campaign"], m
    counts = stats(topic)["counts"]
    assert counts["delivered"] == 50 and counts["scheduled"] == counts["leased"] == 0
    by_campaign = {g: sum(1 for m in handed if m["payload"]["campaign"] == g)
                   for g in ("even", "odd")}
    for g, n in by_campaign.items():
        c = campaign(topic, g)["counts"]
        assert c["delivered"] == n and c["scheduled"] == 0, (g, c, n)


def test_replaces_racing_a_releaser_post_whole_versions_never_early(
        config: Config, client: FlaskClient, auth: dict[str, str]) -> None:
    with receiving(Receiver()) as target:
        topic, _ = webhook_topic(client, auth, target.url)
        statuses = _replace_while_delivered(topic, 50, 10)
        assert target.wait_for(lambda got: len({a.message_id for a in got}) == 50, 30)
    assert statuses.get("200", 0) > 0, statuses
    for a in target.arrivals:
        body = json.loads(a.body)
        assert parse_instant(a.headers["Duetime-Deliver-At"]) == body["at"], a
        assert a.received_ms >= body["at"], a
    # a POST's 2xx comes before the releaser records it delivered: wait for the record
    wait_until(lambda: stats(topic)["counts"]["delivered"] >= 50, 10, every_s=0.1)
    counts = stats(topic)["counts"]
    assert counts["delivered"] == 50 and counts["scheduled"] == counts["leased"] == 0, counts
