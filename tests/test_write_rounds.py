"""Writes sent together (real Cassandra): an enqueue's pointer beside its row, and counters
moved by what applied, written by the process's ledger."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from flask import Flask

from app.core.timeparse import format_ms
from app.delivery import leasing, wakeups
from app.messages import transitions
from app.services import Services
from tests.campaign_helpers import topic_of
from tests.consumers import TopicClient, now_ms


def _stats(topic: TopicClient) -> dict[str, Any]:
    answer = topic.client.get(topic.url("/stats"), headers=topic.headers)
    assert answer.status_code == 200
    stats: dict[str, Any] = answer.get_json()
    return stats


class _StageLater:
    """An enqueue's stage (payloads and rows) that is only sent when the enqueue waits for
    it: what a reader sees while a row is still on its way."""

    def __init__(self, start: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._start = start
        self._args = args
        self._writing: Any = None

    def errors(self) -> Any:
        if self._writing is None:
            self._writing = self._start(*self._args)
        return self._writing.errors()


def test_a_pass_that_finds_a_pointer_before_its_row_leaves_it_for_the_next(
        app: Flask, auth: dict[str, str], monkeypatch: Any) -> None:
    """A server-made id's pointer is written beside its row, so a pass may read the pointer
    first: it must hand nothing out and keep the pointer unspent, so that the next call
    leases the message once its row is there."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    found = topic_of(services, auth, topic.name)
    start_stage, place = services.messages.start_stage, services.placer.place
    between: list[list[Any]] = []

    def place_then_pass(topic_uid: Any, pointers: Any, now_ms: int, pushed: bool = False,
                        landed: Callable[[], object] | None = None) -> Any:
        def pass_first() -> None:
            between.append(leasing.lease(services, found, 1, 0, 30, None))
            assert landed is not None
            landed()

        return place(topic_uid, pointers, now_ms, pushed, pass_first)

    monkeypatch.setattr(services.messages, "start_stage",
                        lambda *args: _StageLater(start_stage, args))
    monkeypatch.setattr(services.placer, "place", place_then_pass)
    answer = topic.enqueue()
    assert answer.status_code == 201, answer.get_json()
    assert between == [[]]  # the pointer was there, its row not yet: nothing handed out
    monkeypatch.undo()
    assert [m["id"] for m in topic.lease(1, wait_ms=2000)] == [answer.get_json()["id"]]


def test_an_enqueue_whose_row_was_not_written_answers_503_and_counts_nothing(
        app: Flask, auth: dict[str, str], monkeypatch: Any) -> None:
    """Its pointer went out beside its row: when the row's write fails the answer is 503,
    nothing is counted and the pointer alone never delivers."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)

    class Failed:
        def __init__(self, fresh: list[Any]) -> None:
            self.fresh = fresh

        def errors(self) -> Any:
            return [], [], [ConnectionError("node down")] * len(self.fresh)

    monkeypatch.setattr(services.messages, "start_stage",
                        lambda topic_uid, payloads, members, fresh=(): Failed(list(fresh)))
    failed = topic.enqueue(delay_ms=500)
    assert failed.status_code == 503, failed.get_json()
    monkeypatch.undo()
    stats = _stats(topic)
    assert stats["counts"]["scheduled"] == 0
    assert sum(w["count"] for w in stats["upcoming"]) == 0
    kept = topic.enqueue(delay_ms=500)
    assert kept.status_code == 201
    assert _stats(topic)["counts"]["scheduled"] == 1
    time.sleep(0.6)
    assert [m["id"] for m in topic.lease(10, wait_ms=2000)] == [kept.get_json()["id"]]
    assert topic.lease(10, wait_ms=1000) == []


def test_acks_that_do_not_apply_leave_the_counts_as_they_were(
        app: Flask, auth: dict[str, str]) -> None:
    """An ack's counters move by what its conditional write applied: a repeated ack and an
    ack of a lost lease move none."""
    topic = TopicClient(app.test_client(), auth, lease_seconds=1)
    topic.enqueue(id="once")
    topic.enqueue(id="lost")
    [first] = topic.lease(1, wait_ms=2000)
    assert topic.ack(first) == 204
    assert topic.ack(first) == 204  # the same token again: nothing changes
    [second] = topic.lease(1, wait_ms=2000)
    time.sleep(1.2)  # its lease ends
    [again] = topic.lease(1, wait_ms=3000)
    assert again["id"] == second["id"]
    assert topic.ack(second) == 409
    counts = _stats(topic)["counts"]
    assert (counts["delivered"], counts["leased"], counts["scheduled"]) == (1, 1, 0), counts
    assert topic.ack(again) == 204
    counts = _stats(topic)["counts"]
    assert (counts["delivered"], counts["leased"], counts["scheduled"]) == (2, 0, 0), counts


def test_a_move_wakes_its_readers_once_its_row_is_written_not_at_its_pointer(
        app: Flask, auth: dict[str, str], monkeypatch: Any) -> None:
    """A move (a nack, a give-back, a new due time) writes its pointer, then its row's LWT. A
    walk woken at the pointer finds it in flight and reads it again only at its next step,
    up to its idle period later: the readers are woken once the row is written."""
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth)
    found = topic_of(services, auth, topic.name)
    answer = topic.enqueue(deliver_at=format_ms(now_ms() + 3_600_000))
    assert answer.status_code == 201
    message_id = answer.get_json()["id"]
    row = services.messages.get(found.uid, message_id)
    assert row is not None
    woken: list[tuple[str, int]] = []

    def version_now() -> int:
        now = services.messages.get(found.uid, message_id)
        assert now is not None
        return now.version

    monkeypatch.setattr(services.placer, "_wake",
                        lambda kind: woken.append((wakeups.label_of(kind), version_now())))
    monkeypatch.setattr(services.placer, "_pull_written",
                        lambda uid: woken.append(("written", version_now())))
    now = services.clock()
    moved = dataclasses.replace(row, version=row.version + 1, due_at_ms=now, updated_at_ms=now)
    assert transitions.move_many(services, found, [moved], now, {row.id: row}) == [moved]
    assert {kind for kind, _ in woken} == {"due", "written"}
    assert {version for _, version in woken} == {moved.version}  # never before the row
