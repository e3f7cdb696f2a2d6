"""Cell marks (app.quiet_marks) on the real node: a lease pass reads a (bucket, shard) again
only when its write count moved, its next pointer nears the pass's window, or its mark has
grown too old for an uncounted write to be ruled out; a wake-up drops them. Messages still
come due on time and never early."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app, pull_wakes
from app.config import Config
from app.models import Topic
from app.quiet_marks import CellMark, QuietMarks, buckets_to_count
from app.scan import CellCounts, ScanResult
from app.services import Services
from app.timeline import COUNTED_AHEAD_MS
from app.timeparse import format_ms
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient, now_ms

LAG_MS = 1000  # Config.safety_lag_ms


def _clear_of_minute_end(needed_ms: int) -> int:
    """Now (epoch ms), once at least needed_ms are left in the current one-minute bucket:
    the cells of a scan are then those of one bucket."""
    left = 60_000 - now_ms() % 60_000
    if left < needed_ms:
        time.sleep(left / 1000 + 0.05)
    return now_ms()


def _scan(services: Services, topic: Topic, at_ms: int, marks: dict[Any, CellMark],
          peek_ms: int = 2000) -> ScanResult:
    """A pass's read at at_ms (its clock) with the marks of the passes before."""
    buckets = buckets_to_count(at_ms, services.config.bucket_ms, LAG_MS)
    cells = CellCounts(at_ms, frozenset(buckets),
                       services.timeline.start_write_counts(topic.uid, buckets), marks, LAG_MS)
    return services.scanner.scan(topic, at_ms, 10, ahead_ms=100, peek_ms=peek_ms, cells=cells)


def _counted(services: Services, topic: Topic, cell: tuple[int, int], n: int) -> None:
    """Wait until the cell's write count is n: a count is bumped once its pointer is durable,
    without the writer waiting for it (a same-host reader is woken meanwhile)."""
    deadline = time.monotonic() + 5
    while services.timeline.write_counts(topic.uid, [cell[0]]).get(cell) != n:
        assert time.monotonic() < deadline, f"the count of {cell} never reached {n}"
        time.sleep(0.01)


def _topic(client: FlaskClient, services: Services, **settings: Any
           ) -> tuple[TopicClient, Topic]:
    tenant, auth = new_tenant_key(services)
    topic = TopicClient(client, auth, **settings)
    known = services.topics.get(tenant, topic.name)
    assert known is not None
    return topic, known


def test_a_marked_cell_is_read_again_when_its_next_pointer_nears_or_its_count_moves(
        client: FlaskClient, services: Services) -> None:
    topic, known = _topic(client, services, shards=1)
    now = _clear_of_minute_end(10_000)
    later = now + 1500
    assert topic.enqueue(id="later", deliver_at=format_ms(later)).status_code == 201
    _counted(services, known, (later // 60_000, 0), 1)
    first = _scan(services, known, now, {})
    assert first.due == [] and first.cells_read == 1 and first.cell_marks is not None
    [(cell, mark)] = first.cell_marks.items()
    assert (mark.count, mark.seen_through_ms) == (1, later)
    # nothing written since, and "later" is past the window: no read, and it is known next
    second = _scan(services, known, now + 50, first.cell_marks)
    assert second.cells_read == 0 and second.due == [] and second.next_ms == later
    assert second.cell_marks == first.cell_marks
    # a write counted in the cell: read again, and what was written is found
    assert topic.enqueue(id="soon", deliver_at=format_ms(now + 300)).status_code == 201
    _counted(services, known, cell, 2)
    third = _scan(services, known, now + 250, second.cell_marks)
    assert third.cells_read == 1 and [d.row.id for d in third.due] == ["soon"]
    assert third.cell_marks == {}  # a cell that held something due is not marked
    services.scanner.spend(known, [d.pointer for d in third.due])  # as a pass's take does
    fourth = _scan(services, known, now + 300, {})
    assert fourth.cells_read == 1 and fourth.cell_marks is not None
    assert [m.seen_through_ms for m in fourth.cell_marks.values()] == [later]
    assert _scan(services, known, now + 400, fourth.cell_marks).cells_read == 0
    # "later" nearing the window: read again although its count stands
    fifth = _scan(services, known, later - 50, fourth.cell_marks)
    assert fifth.cells_read == 1 and [d.row.id for d in fifth.due] == ["later"]


def test_a_mark_too_old_to_rule_out_an_uncounted_write_is_read_again(
        client: FlaskClient, services: Services) -> None:
    """A pointer written due more than COUNTED_AHEAD_MS ahead moves no count: a mark stands
    only while no such write could have come into a pass's window since the mark's read."""
    topic, known = _topic(client, services, shards=1)
    now = _clear_of_minute_end(20_000)
    anchor = now + 12_500
    assert topic.enqueue(id="anchor", deliver_at=format_ms(anchor)).status_code == 201
    first = _scan(services, known, now, {}, peek_ms=13_000)
    assert first.cell_marks is not None
    [mark] = first.cell_marks.values()
    assert (mark.count, mark.seen_through_ms) == (None, anchor)  # not counted: too far ahead
    far = now_ms() + COUNTED_AHEAD_MS + 500
    assert topic.enqueue(id="far", deliver_at=format_ms(far)).status_code == 201
    time.sleep(0.2)  # were it counted, its count would have landed by now
    assert services.timeline.write_counts(known.uid, [anchor // 60_000]) == {}
    # its window still ends within COUNTED_AHEAD_MS less the safety lag of the mark's read
    standing = _scan(services, known, now + COUNTED_AHEAD_MS - LAG_MS - 100, first.cell_marks)
    assert standing.cells_read == 0 and standing.due == []
    # past that, the mark no longer stands: the cell is read and "far" is found in time
    due = _scan(services, known, far - 50, first.cell_marks)
    assert due.cells_read == 1 and [d.row.id for d in due.due] == ["far"]


def test_cell_marks_are_refused_after_a_wake_up_and_density_outlives_it() -> None:
    marks = QuietMarks(LAG_MS)
    uid = uuid.uuid4()
    cells = {(1, 0): CellMark(1000, 3, 5000)}
    generation = marks.generation(uid)
    assert marks.keep_cells(uid, cells, generation, dense=False)
    assert marks.cells(uid) == cells and not marks.dense(uid)
    marks.forget(uid)  # a wake-up: a pointer may have landed that its count does not show yet
    assert marks.cells(uid) == {}
    assert not marks.keep_cells(uid, cells, generation, dense=True)  # begun before the wake
    assert marks.cells(uid) == {} and marks.dense(uid)
    assert marks.keep_cells(uid, cells, marks.generation(uid), dense=True)


def test_a_cell_mark_stands_only_for_its_count_and_within_what_it_saw() -> None:
    mark = CellMark(read_at_ms=10_000, count=4, seen_through_ms=12_000)
    assert mark.stands(4, 11_999, LAG_MS)
    assert not mark.stands(5, 11_999, LAG_MS)  # a write since
    assert not mark.stands(None, 11_999, LAG_MS)
    assert not mark.stands(4, 12_000, LAG_MS)  # its next pointer is in the window
    far = CellMark(read_at_ms=10_000, count=None, seen_through_ms=60_000)
    assert far.stands(None, 10_000 + COUNTED_AHEAD_MS - LAG_MS, LAG_MS)
    assert not far.stands(None, 10_000 + COUNTED_AHEAD_MS - LAG_MS + 1, LAG_MS)


def test_a_long_poll_on_a_trickle_reads_few_cells_a_pass_and_gets_each_message_in_time(
        config: Config, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One consumer long-polling a 16-shard topic whose messages come due 150 ms apart: after
    the first pass, a pass reads the cells where something nears, not all 16."""
    monkeypatch.setattr(pull_wakes, "READY_AFTER_S", 0)  # may rest once registered
    app: Flask = create_app(config)
    services: Services = app.extensions["duetime"]
    topic = TopicClient(app.test_client(), auth, shards=16)
    topic.lease(max_messages=1, wait_ms=0)  # registers the process for wake-ups
    deadline = time.monotonic() + 10
    while not services.pull_wakes.ready():
        assert time.monotonic() < deadline, "the wake-up listener never registered"
        time.sleep(0.05)
    start = _clear_of_minute_end(15_000) + 1500
    ids = [f"m{n}" for n in range(20)]
    sent = topic.batch([{"id": i, "deliver_at": format_ms(start + 150 * n)}
                        for n, i in enumerate(ids)])
    assert {r["status"] for r in sent} == {201}
    reads: list[int] = []
    real = services.scanner.scan

    def counted(*args: Any, **kwargs: Any) -> ScanResult:
        result = real(*args, **kwargs)
        if kwargs.get("cells") is not None:
            reads.append(result.cells_read)
        return result

    services.scanner.scan = counted  # type: ignore[method-assign]
    got: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while len(got) < len(ids) and time.monotonic() < deadline:
        for m in topic.lease(max_messages=5, wait_ms=1000):
            got[m["id"]] = m["received_at"] - (start + 150 * ids.index(m["id"]))
            assert topic.ack(m) == 204
    services.close()
    assert set(got) == set(ids)
    assert max(got.values()) < 1000, got  # none early (TopicClient checks), none left behind
    assert len(reads) > 10, reads
    assert sum(reads) / len(reads) < 8, reads  # of 16 cells each before marks
