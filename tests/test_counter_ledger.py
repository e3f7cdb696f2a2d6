"""The counter ledger on the real node: a process's counter moves are summed and written
within its flush period, by a read of counts in the process at once, at close what is
left, in batches no wider than a production node takes without a warning, and a flush the
node refused keeps its moves for the next one."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from app.config import Config
from app.errors import StoreUnavailable
from app.store.counts import CounterLedger, CountStore, flush_counters
from app.store.session import CassandraSession
from tests.waiting import wait_until

_READ = "SELECT state, n FROM {ks}.state_counts WHERE topic_uid = ?"


def _stored(db: CassandraSession, topic_uid: uuid.UUID) -> dict[str, int]:
    """The counts as stored, read without writing any ledger first."""
    return {r["state"]: r["n"] for r in db.execute(_READ, (topic_uid,))}


class _Writes:
    """Counts the counter requests a session sends, and keeps the updates of each (the
    node still does the work)."""

    def __init__(self, db: CassandraSession) -> None:
        self.requests = 0
        self.sent: list[list[tuple[str, Sequence[Any]]]] = []
        self._send = db.counter_batch
        db.counter_batch = self._counted  # type: ignore[method-assign]

    def _counted(self, updates):  # type: ignore[no-untyped-def]
        self.requests += 1
        self.sent.append(list(updates))
        return self._send(updates)


def test_many_moves_of_a_counter_are_written_once_summed(config: Config) -> None:
    db = CassandraSession(config)
    ledger = CounterLedger(db, flush_s=3600)
    writes = _Writes(db)
    topic_uid = uuid.uuid4()
    try:
        for _ in range(200):
            ledger.add(CountStore.state_updates(topic_uid, {"scheduled": 1}))
        ledger.add(CountStore.state_updates(topic_uid, {"scheduled": -50, "leased": 50}))
        assert _stored(db, topic_uid) == {}  # nothing written by the moves themselves
        ledger.flush()
        assert _stored(db, topic_uid) == {"scheduled": 150, "leased": 50}
        assert writes.requests == 1
        ledger.flush()  # nothing left: no request
        assert writes.requests == 1
    finally:
        ledger.close()
        db.shutdown()


def test_moves_of_many_partitions_go_in_batches_of_at_most_ten_partitions(
        config: Config) -> None:
    """Cassandra warns of an unlogged batch across more than 10 partitions by default, so a
    flush of 25 topics' moves (25 partitions of state_counts, 3 updates each) sends batches
    of at most 10 topics, a topic's updates in one batch, and every sum is written."""
    db = CassandraSession(config)
    ledger = CounterLedger(db, flush_s=3600)
    writes = _Writes(db)
    topics = [uuid.uuid4() for _ in range(25)]
    try:
        for topic_uid in topics:
            ledger.add(CountStore.state_updates(
                topic_uid, {"scheduled": 3, "leased": 2, "delivered": 1}))
        assert ledger.flush() is True
        assert all(_stored(db, t) == {"scheduled": 3, "leased": 2, "delivered": 1}
                   for t in topics)
        partitions = [{params[1] for _, params in batch} for batch in writes.sent]
        assert max(len(p) for p in partitions) <= 10
        assert sum(len(p) for p in partitions) == len(topics)  # no topic split
        assert writes.requests == 3  # 75 updates: 10 topics (30 updates) a batch
    finally:
        ledger.close()
        db.shutdown()


def test_the_ledger_writes_its_moves_by_itself_within_its_period(config: Config) -> None:
    db = CassandraSession(config)
    counts = CountStore(db)
    topic_uid = uuid.uuid4()
    try:
        counts.add_states(topic_uid, {"scheduled": 2})
        assert wait_until(lambda: _stored(db, topic_uid) == {"scheduled": 2}, 10)
    finally:
        counts.close()
        db.shutdown()


def test_a_read_of_counts_in_the_process_writes_its_moves_first(config: Config) -> None:
    db = CassandraSession(config)
    slow = CounterLedger(db, flush_s=3600)  # its thread would not write for an hour
    counts = CountStore(db)
    topic_uid = uuid.uuid4()
    try:
        slow.add(counts.state_updates(topic_uid, {"dead": 3}))
        assert counts.states(topic_uid) == {"dead": 3}
        slow.add(counts.state_updates(topic_uid, {"dead": -1}))
        flush_counters()
        assert _stored(db, topic_uid) == {"dead": 2}
    finally:
        slow.close()
        counts.close()
        db.shutdown()


def test_close_writes_what_is_left_and_ends_the_thread(config: Config) -> None:
    db = CassandraSession(config)
    ledger = CounterLedger(db, flush_s=3600)
    topic_uid = uuid.uuid4()
    try:
        ledger.add(CountStore.state_updates(topic_uid, {"cancelled": 7}))
        thread = ledger._thread
        assert thread is not None and thread.is_alive()
        started = time.monotonic()
        ledger.close()
        assert time.monotonic() - started < 5 and not thread.is_alive()
        assert _stored(db, topic_uid) == {"cancelled": 7}
    finally:
        db.shutdown()


@pytest.mark.parametrize("step", ["counter_groups", "counter_batch"])
def test_a_flush_the_node_refused_keeps_its_moves_for_the_next(config: Config,
                                                                 step: str) -> None:
    """A flush refused before anything applied (no node to take it, while its statements
    are prepared or its batch is sent) keeps its moves: they are written once, neither lost
    nor doubled."""
    db = CassandraSession(config)
    ledger = CounterLedger(db, flush_s=3600)
    topic_uid = uuid.uuid4()
    send = getattr(db, step)
    refused: list[int] = []

    def refuse_once(updates):  # type: ignore[no-untyped-def]
        if not refused:
            refused.append(len(updates))
            raise StoreUnavailable("Cassandra unavailable: NoHostAvailable")
        return send(updates)

    try:
        ledger.add(CountStore.state_updates(topic_uid, {"delivered": 4}))
        setattr(db, step, refuse_once)
        assert ledger.flush() is False  # refused: kept
        assert refused and _stored(db, topic_uid) == {}
        assert ledger.flush() is True
        assert ledger.flush() is True  # nothing left
        assert _stored(db, topic_uid) == {"delivered": 4}
    finally:
        ledger.close()
        db.shutdown()
