"""app.found_due on its own (no Cassandra): what is kept, for how long, and what drops it,
with what another process of the host took (app.taken_log, files in a temporary directory).
Its use by lease passes is tested against the real node in tests/test_leasing.py."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from app import found_due, taken_log
from app.fairness import fair_order, known_turns_end
from app.found_due import Found, FoundDue
from app.models import MessageState, Pointer
from app.scan import Due
from app.taken_log import TakenLog

TOPIC = uuid.uuid4()


class Clock:
    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def _due(message_id: str, due_ms: int, campaign: str | None = None, priority: int = 0) -> Due:
    row = MessageState(TOPIC, message_id, "scheduled", 1, due_ms, due_ms, priority, campaign,
                       0, 0, "h", None, None, None, None, due_ms, due_ms)
    return Due(Pointer(due_ms, message_id, 1, 0, 0), row)


def test_of_a_read_cut_short_what_is_kept_ends_where_the_first_group_runs_out() -> None:
    big = [_due(f"b{n}", 1000 + n, "big") for n in range(6)]
    small = [_due(f"s{n}", 2000 + n, "small") for n in range(3)]
    order = fair_order(big + small)
    assert [d.row.id for d in order[:6]] == ["b0", "s0", "b1", "s1", "b2", "s2"]
    # two leased: kept through small's last found (s2), not the big ones after it
    assert [d.row.id for d in order[2:known_turns_end(order, 2)]] == ["b1", "s1", "b2", "s2"]
    # small's found ones all leased: it may have more unread, so nothing is kept
    assert known_turns_end(order, 6) == 6
    # a lower priority value goes first: its group running out ends what is kept
    lower = [_due(f"l{n}", 1000 + n, "big", priority=5) for n in range(3)]
    first = [_due("f0", 3000, "small", priority=0)]
    order = fair_order(lower + first)
    assert [d.row.id for d in order[:known_turns_end(order, 0)]] == ["f0"]
    # one group: all of it
    assert known_turns_end(fair_order(big), 1) == 6


def test_kept_messages_are_taken_once_and_only_those_due_by_the_read() -> None:
    clock = Clock()
    found = FoundDue(clock, keep_ms=200)
    read_at = clock.ms
    due = [_due("a", read_at - 5), _due("b", read_at), _due("late", read_at + 1)]
    found.keep(TOPIC, Found(read_at, found.mark(), due))
    clock.ms += 50
    taken = found.take(TOPIC)
    assert taken is not None and [d.row.id for d in taken.due] == ["a", "b"]
    assert taken.read_at_ms == read_at
    assert found.take(TOPIC) is None  # taken: no longer kept


def test_a_list_older_than_keep_ms_is_neither_kept_nor_given() -> None:
    clock = Clock()
    found = FoundDue(clock, keep_ms=200)
    found.keep(TOPIC, Found(clock.ms, found.mark(), [_due("a", clock.ms)]))
    clock.ms += 200
    assert found.take(TOPIC) is None
    stale = Found(clock.ms - 200, found.mark(), [_due("b", clock.ms - 300)])
    found.keep(TOPIC, stale)
    assert found.take(TOPIC) is None


def test_a_pointer_written_that_could_come_due_meanwhile_drops_the_list() -> None:
    clock = Clock()
    found = FoundDue(clock, keep_ms=200)
    found.keep(TOPIC, Found(clock.ms, found.mark(), [_due("a", clock.ms)]))
    found.placed(TOPIC, clock.ms + 30_000)  # a lease's expiry: comes due long after
    found.placed(uuid.uuid4(), clock.ms)  # another topic
    kept = found.take(TOPIC)
    assert kept is not None
    found.keep(TOPIC, kept)
    found.placed(TOPIC, clock.ms + 100)
    assert found.take(TOPIC) is None


def test_a_read_that_began_before_a_pointer_was_written_is_not_kept() -> None:
    clock = Clock()
    found = FoundDue(clock, keep_ms=200)
    mark = found.mark()  # a pass starts reading the timeline
    found.placed(TOPIC, clock.ms)  # meanwhile this process enqueues a message due now
    found.keep(TOPIC, Found(clock.ms, mark, [_due("a", clock.ms)]))
    assert found.take(TOPIC) is None
    other = uuid.uuid4()
    found.keep(other, Found(clock.ms, mark, [_due("b", clock.ms)]))
    assert found.take(other) is not None  # the write was of another topic
    later = found.mark()
    found.keep(TOPIC, Found(clock.ms, later, [_due("c", clock.ms)]))
    assert found.take(TOPIC) is not None


def test_lists_no_call_came_back_for_are_dropped_oldest_first_past_max_lists(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(found_due, "MAX_LISTS", 3)
    clock = Clock()
    found = FoundDue(clock, keep_ms=200)
    topics = [uuid.uuid4() for _ in range(4)]
    for topic in topics:
        found.keep(topic, Found(clock.ms, found.mark(), [_due("a", clock.ms)]))
    assert found.take(topics[0]) is None
    assert all(found.take(topic) is not None for topic in topics[1:])


def test_what_another_process_of_the_host_took_leaves_the_list(tmp_path: Path) -> None:
    clock = Clock()
    mine = FoundDue(clock, keep_ms=200, shared=TakenLog(tmp_path))
    other = FoundDue(clock, keep_ms=200, shared=TakenLog(tmp_path))
    due = [_due(f"m{n}", clock.ms - 10 + n) for n in range(5)]
    for process in (mine, other):  # each pass: catch up, read, keep, record its takes
        process.catch_up(TOPIC)
        process.keep(TOPIC, Found(clock.ms, process.mark(), due))
        process.took(TOPIC, [])
    other.catch_up(TOPIC)
    taken = other.take(TOPIC)
    assert taken is not None and taken.due[0].row.id == "m0"
    other.keep(TOPIC, dataclasses.replace(taken, due=taken.due[2:]))
    other.took(TOPIC, ["m0", "m1"])
    mine.catch_up(TOPIC)
    left = mine.take(TOPIC)
    assert left is not None and [d.row.id for d in left.due] == ["m2", "m3", "m4"]
    mine.took(TOPIC, ["m2"])
    other.catch_up(TOPIC)  # its own takes are not news to it; the other's are
    left = other.take(TOPIC)
    assert left is not None and [d.row.id for d in left.due] == ["m3", "m4"]


def test_a_log_started_over_or_never_read_drops_the_list(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taken_log, "MAX_BYTES", taken_log.HEADER_BYTES + 40)
    clock = Clock()
    shared = TakenLog(tmp_path)
    mine, other = FoundDue(clock, shared=shared), FoundDue(clock, shared=TakenLog(tmp_path))
    due = [_due(f"m{n}", clock.ms) for n in range(3)]
    mine.keep(TOPIC, Found(clock.ms, mine.mark(), due))
    mine.catch_up(TOPIC)  # never read: what others took is unknown
    assert mine.take(TOPIC) is None
    mine.keep(TOPIC, Found(clock.ms, mine.mark(), due))
    mine.took(TOPIC, [])
    other.catch_up(TOPIC)
    other.took(TOPIC, [f"id-{n:02d}" for n in range(6)])  # 36 bytes: fits
    mine.catch_up(TOPIC)
    assert mine.take(TOPIC) is not None  # nothing of its list among them
    mine.keep(TOPIC, Found(clock.ms, mine.mark(), due))
    mine.took(TOPIC, [])
    other.catch_up(TOPIC)
    other.took(TOPIC, ["m0", "m1"])  # past MAX_BYTES: the file starts over
    assert (tmp_path / f"{TOPIC}.taken").read_bytes() == b"%015d\nm0\nm1\n" % 1
    mine.catch_up(TOPIC)
    assert mine.take(TOPIC) is None  # what came before the new start is lost to it


def test_an_unusable_directory_only_stops_the_sharing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    clock = Clock()
    process = FoundDue(clock, shared=TakenLog(tmp_path / "file" / "below"))
    process.keep(TOPIC, Found(clock.ms, process.mark(), [_due("a", clock.ms)]))
    process.took(TOPIC, ["x"])
    process.catch_up(TOPIC)
    kept = process.take(TOPIC)  # kept as by a process alone: the conditional write decides
    assert kept is not None and [d.row.id for d in kept.due] == ["a"]


def test_a_quiet_log_starts_over_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = TakenLog(tmp_path)
    shared.record(TOPIC, [f"id-{n}" for n in range(100)])
    path = tmp_path / f"{TOPIC}.taken"
    assert path.stat().st_size > 500
    shared.record(TOPIC, ["soon"])  # written a moment ago: appended
    assert path.read_bytes().endswith(b"id-99\nsoon\n")
    monkeypatch.setattr(taken_log, "QUIET_S", 0.0)
    shared.record(TOPIC, ["later"])
    assert path.read_bytes() == b"%015d\nlater\n" % 1
