"""Conditional batches per home, on the real node: each row of a batch gets exactly the outcome
a single-row LWT would give it (applied, lost the race, already exists), also when batches
race for the same rows."""

from __future__ import annotations

import base64
import dataclasses
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from cassandra import OperationTimedOut
from flask.testing import FlaskClient

from app.core import ids as id_module
from app.core.ids import (
    SHARED_BELOW,
    SHARED_HOME_MS,
    SHARED_HOME_ROWS,
    SharedHomes,
    home_of,
    homes_for_request,
    new_message_id,
)
from app.core.timeline import shard_of
from app.errors import StoreUnavailable
from app.models import MessageState
from app.services import Services
from tests.consumers import TopicClient

TTL_S = 3600


def _row(topic_uid: uuid.UUID, message_id: str, content: str = "c1") -> MessageState:
    now = int(time.time() * 1000)
    return MessageState(
        topic_uid=topic_uid, id=message_id, state="scheduled", version=1, due_at_ms=now,
        deliver_at_ms=now, priority=100, campaign=None, shard=0, attempts=0,
        content_hash=content, lease_token=None, lease_expires_at_ms=None, consumer=None,
        last_error=None, created_at_ms=now, updated_at_ms=now)


def _one_home(services: Services, count: int) -> tuple[uuid.UUID, list[MessageState]]:
    topic_uid = uuid.uuid4()
    home = homes_for_request(16)[3]
    rows = [_row(topic_uid, new_message_id(int(time.time() * 1000), home)) for _ in range(count)]
    assert {home_of(r.id) for r in rows} == {home}
    assert services.messages.insert_fresh_many([(r, TTL_S) for r in rows]) == [(True, None)] * count
    return topic_uid, rows


def _leased(row: MessageState) -> MessageState:
    return dataclasses.replace(row, state="leased", version=row.version + 1,
                               lease_token=uuid.uuid4())


def test_a_stale_row_in_a_batch_loses_alone(services: Services) -> None:
    topic_uid, rows = _one_home(services, 150)  # more than one batch of the home
    changes = [(_leased(r), 2 if n % 7 == 0 else 1, TTL_S) for n, r in enumerate(rows)]
    outcomes = services.messages.cas_many(changes)
    assert outcomes == [n % 7 != 0 for n in range(len(rows))]
    stored = services.messages.get_many(topic_uid, [r.id for r in rows])
    assert [stored[r.id].version for r in rows] == [1 if n % 7 == 0 else 2
                                                    for n in range(len(rows))]
    assert all(stored[r.id].lease_token == c[0].lease_token
               for r, c, ok in zip(rows, changes, outcomes, strict=True) if ok)


def test_a_batch_whose_answer_timed_out_in_the_driver_is_resolved_by_serial_reads(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver gave up waiting (OperationTimedOut) for a batch: each row is read at SERIAL,
    never assumed. A change the node applied is won (its taker hands the message out), one
    another change beat is lost, and one the node never applied, its row still at the
    expected version, stays undecided (its taker tries again; called lost, its pointer
    would be spent and the message stranded)."""
    _, rows = _one_home(services, 4)
    cas_many = services.messages.cas_many
    run_batches = services.messages.db.run_batches

    def answers_lost(batches: Any, *args: Any, **kwargs: Any) -> Any:
        return [(False, OperationTimedOut()) for _ in run_batches(batches, *args, **kwargs)]

    def never_sent(batches: Any, *args: Any, **kwargs: Any) -> Any:
        return [(False, OperationTimedOut()) for _ in batches]

    monkeypatch.setattr(services.messages.db, "run_batches", answers_lost)
    assert cas_many([(_leased(r), 1, TTL_S) for r in rows[:2]]) == [True, True]
    assert cas_many([(_leased(rows[0]), 1, TTL_S)]) == [False]  # version 2 now
    monkeypatch.setattr(services.messages.db, "run_batches", never_sent)
    [undecided] = cas_many([(_leased(rows[2]), 1, TTL_S)])
    assert isinstance(undecided, OperationTimedOut)
    stored = services.messages.get_many(rows[0].topic_uid, [r.id for r in rows])
    assert [stored[r.id].version for r in rows] == [2, 2, 1, 1]


def test_a_change_left_undecided_that_applied_after_all_is_found_at_the_next_try(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """A take whose batch timed out, and whose SERIAL read failed too, is undecided; the node
    had applied it. The taker's next try of the same rows (new leases, the same expected
    version) loses its LWTs, and earlier_changes finds the row as the first try wrote it, so
    the taker hands that out instead of leaving it leased to nobody until its lease runs
    out. A row changed again meanwhile is not claimed, and nothing is found twice."""
    _, rows = _one_home(services, 2)
    store = services.messages
    run_batches = store.db.run_batches

    def answers_lost(batches: Any, *args: Any, **kwargs: Any) -> Any:
        return [(False, OperationTimedOut()) for _ in run_batches(batches, *args, **kwargs)]

    def serial_read_fails(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("Cassandra unavailable: ReadTimeout")

    first = [_leased(r) for r in rows]
    with monkeypatch.context() as patched:
        patched.setattr(store.db, "run_batches", answers_lost)
        patched.setattr(store, "get", serial_read_fails)
        undecided = store.cas_many([(f, 1, TTL_S) for f in first])
    assert all(isinstance(o, StoreUnavailable) for o in undecided), undecided
    assert store.cas_many([(_leased(first[1]), 2, TTL_S)]) == [True]  # row 1 moves on
    again = [(_leased(r), 1, TTL_S) for r in rows]
    outcomes = store.cas_many(again)
    assert outcomes == [False, False]
    found = store.earlier_changes(again, outcomes)
    assert list(found) == [0]
    assert (found[0].version, found[0].lease_token) == (2, first[0].lease_token)
    assert store.earlier_changes(again, outcomes) == {}


def test_two_changes_of_one_row_in_one_call_apply_once(services: Services) -> None:
    _, rows = _one_home(services, 3)
    first, second = _leased(rows[0]), _leased(rows[0])
    outcomes = services.messages.cas_many(
        [(first, 1, TTL_S), (_leased(rows[1]), 1, TTL_S), (second, 1, TTL_S)])
    assert outcomes == [True, True, False]
    found = services.messages.get(rows[0].topic_uid, rows[0].id)
    assert found is not None and found.lease_token == first.lease_token


def test_insert_if_not_exists_in_a_batch_reports_each_existing_row(services: Services) -> None:
    topic_uid = uuid.uuid4()
    home = homes_for_request(16)[0]
    ids = [new_message_id(int(time.time() * 1000), home) for _ in range(30)]
    earlier = services.messages.insert_many([(_row(topic_uid, i, "old"), TTL_S) for i in ids[:10]])
    assert earlier == [(True, None)] * 10
    answers = services.messages.insert_many([(_row(topic_uid, i, "new"), TTL_S) for i in ids])
    assert answers[10:] == [(True, None)] * 20
    for answer in answers[:10]:
        assert isinstance(answer, tuple) and answer[0] is False
        assert answer[1] is not None and answer[1].content_hash == "old"
    stored = services.messages.get_many(topic_uid, ids)
    assert [stored[i].content_hash for i in ids] == ["old"] * 10 + ["new"] * 20


def test_racing_batches_over_one_home_apply_each_row_once(services: Services) -> None:
    topic_uid, rows = _one_home(services, 100)
    racers = 8
    barrier = threading.Barrier(racers)
    wins: list[list[str]] = [[] for _ in range(racers)]
    tokens: dict[tuple[int, str], uuid.UUID | None] = {}

    def race(index: int) -> None:
        mine = [_leased(r) for r in rows]
        for m in mine:
            tokens[(index, m.id)] = m.lease_token
        barrier.wait()
        outcomes = services.messages.cas_many([(m, 1, TTL_S) for m in mine])
        wins[index] = [m.id for m, ok in zip(mine, outcomes, strict=True) if ok is True]
        assert not [o for o in outcomes if isinstance(o, Exception)]

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for w in wins for i in w]
    assert sorted(won) == sorted(r.id for r in rows)  # every row exactly once
    stored = services.messages.get_many(topic_uid, [r.id for r in rows])
    for index, ids in enumerate(wins):
        assert all(stored[i].lease_token == tokens[(index, i)] for i in ids)


def test_one_request_puts_server_ids_in_one_home_per_shard(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, shards=16)
    results = topic.batch([{"delay_ms": 60_000} for _ in range(1000)])
    assert [r["status"] for r in results] == [201] * 1000
    homes: dict[int, set[int]] = {}
    for r in results:
        homes.setdefault(home_of(r["id"]), set()).add(shard_of(r["id"], 16))
    assert len(homes) == 16
    assert all(shards == {home % 16} for home, shards in homes.items())
    second = topic.batch([{"delay_ms": 60_000} for _ in range(10)])
    assert not {home_of(r["id"]) for r in second} & set(homes)  # not one of the batch's homes
    sample = results[::97]
    for r in sample:
        body = client.get(topic.url(f"/messages/{r['id']}"), headers=auth).get_json()
        assert body["state"] == "scheduled" and body["payload"] == {"n": 1}


def test_a_home_full_of_large_payloads_is_written_in_bounded_batches(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth, shards=1)  # one shard: the whole request is one home
    bodies = [base64.b64encode(bytes([n]) * 60_000).decode() for n in range(40)]
    results = topic.batch([{"payload_base64": b, "delay_ms": 60_000} for b in bodies])
    assert [r["status"] for r in results] == [201] * 40  # 2.4 MB: three batches of <= 1 MiB
    assert len({home_of(r["id"]) for r in results}) == 1
    for r, body in list(zip(results, bodies, strict=True))[::13]:
        got = client.get(topic.url(f"/messages/{r['id']}"), headers=auth).get_json()
        assert got["payload_base64"] == body


@pytest.mark.parametrize("shards", [16, 1])
def test_one_message_enqueues_of_a_process_share_a_home_of_their_shard(
        client: FlaskClient, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        shards: int) -> None:
    # a home's time (1 s) is the other test's: a slow machine must not split these requests
    monkeypatch.setattr(id_module, "SHARED_HOME_MS", 600_000)
    topic = TopicClient(client, auth, shards=shards)
    answers = [topic.enqueue(delay_ms=60_000, payload={"n": n}) for n in range(6)]
    assert [a.status_code for a in answers] == [201] * 6
    ids = [a.get_json()["id"] for a in answers]
    assert len({home_of(i) for i in ids}) == 1  # six requests, one partition
    assert len({shard_of(i, shards) for i in ids}) == 1
    small = topic.batch([{"delay_ms": 60_000} for _ in range(3)])  # fewer than SHARED_BELOW
    assert {home_of(r["id"]) for r in small} == {home_of(ids[0])}
    large = topic.batch([{"delay_ms": 60_000} for _ in range(SHARED_BELOW)])
    assert home_of(ids[0]) not in {home_of(r["id"]) for r in large}  # homes of its own
    for n, message_id in enumerate(ids):
        body = topic.get(message_id).get_json()
        assert body["state"] == "scheduled" and body["payload"] == {"n": n}


def test_a_shared_home_is_left_when_it_is_full_or_old_and_is_per_topic() -> None:
    homes = SharedHomes()
    topic, other = uuid.uuid4(), uuid.uuid4()
    first = homes.home(topic, 1, 1_000)
    assert all(homes.home(topic, 1, 1_000 + n) == first for n in range(SHARED_HOME_ROWS - 2))
    assert homes.home(topic, 2, 1_200) != first  # 99 taken: two more do not fit
    second = homes.home(topic, 1, 1_300)
    assert homes.home(topic, 1, 1_200 + SHARED_HOME_MS - 1) == second
    assert homes.home(topic, 1, 1_200 + SHARED_HOME_MS) != second  # its time is over
    third = homes.home(topic, 1, 5_000)
    assert homes.home(other, 1, 5_000) != third
    assert homes.home(topic, 1, 4_000) != third  # a clock set back starts a fresh home
    shards = Counter(homes.home(topic, SHARED_HOME_ROWS, 10_000) % 16 for _ in range(3200))
    assert set(shards) == set(range(16))  # each home full at once: any shard, none favoured
    assert max(shards.values()) < 2 * 200 and min(shards.values()) > 200 / 2
