"""Pure logic, no database: configuration, time parsing, bucket and shard math, ids."""

from __future__ import annotations

import dataclasses
import gc
import random
import types
import uuid
from collections import Counter

import pytest

from app.config import ConfigError, load_config
from app.core import timeline
from app.core.ids import (
    CLIENT_ID,
    EMBEDDED_HOMES,
    HASHED_HOMES,
    home_of,
    homes_for_request,
    new_message_id,
)
from app.core.timeline import fair_share, release_slot_of
from app.core.timeparse import TimeFormatError, format_ms, parse_instant, parse_local_time
from app.delivery.fairness import FairQueue, fair_first, fair_order, group_place, turn_group
from app.delivery.scan import Due, PointerKey, is_live, pointer_key
from app.errors import StoreUnavailable
from app.messages.enqueue import NewMessage, home_by_due_time, nesting
from app.models import MessageState, Payload, Pointer
from app.ops.cluster_clock import ClusterClock
from workers import count_reads
from workers.count_reads import count_groups
from workers.held import HeldMessages, ready_ms
from workers.walk import Walk


def test_config_reads_environment_and_validates() -> None:
    cfg = load_config({"DUETIME_CONTACT_POINTS": "a, b", "DUETIME_CQL_PORT": "9999"})
    assert cfg.contact_points == ("a", "b") and cfg.cql_port == 9999
    with pytest.raises(ConfigError, match="DUETIME_CQL_PORT"):
        load_config({"DUETIME_CQL_PORT": "nine"})
    with pytest.raises(ConfigError, match="DUETIME_CONSISTENCY"):
        load_config({"DUETIME_CONSISTENCY": "MOST"})
    with pytest.raises(ConfigError, match="DUETIME_MIN_LEASE_S"):
        load_config({"DUETIME_MIN_LEASE_S": "100", "DUETIME_MAX_LEASE_S": "10"})
    # the document's delay_ms maximum is 365 days: a server may only lower the horizon
    assert load_config({"DUETIME_HORIZON_DAYS": "30"}).horizon_days == 30
    for days in ("0", "366"):
        with pytest.raises(ConfigError, match="DUETIME_HORIZON_DAYS"):
            load_config({"DUETIME_HORIZON_DAYS": days})
    # settings whose wrong sign would lose messages or refuse every call, not fail loudly
    for name, value in (("RETENTION_DAYS", "0"), ("RETENTION_DAYS", "-1"),
                        ("REQUEST_TIMEOUT_S", "0"), ("SAFETY_LAG_MS", "-1000"),
                        ("MAX_WAIT_MS", "-1"), ("RATE_BURST", "-5"),
                        ("REQUEST_TIMEOUT_S", "nan"), ("RATE_LIMIT_PER_S", "nan")):
        with pytest.raises(ConfigError, match=f"DUETIME_{name}"):
            load_config({f"DUETIME_{name}": value})
    assert load_config({"DUETIME_SAFETY_LAG_MS": "0"}).safety_lag_ms == 0


def test_instants_parse_and_format_with_milliseconds() -> None:
    ms = parse_instant("2026-12-01T09:00:00.250Z")
    assert format_ms(ms) == "2026-12-01T09:00:00.250Z"
    assert parse_instant("2026-12-01T11:00:00.250+02:00") == ms
    assert parse_instant(ms) == ms
    for bad in ("2026-12-01T09:00:00", "tomorrow", True, 1.5, None):
        with pytest.raises(TimeFormatError):
            parse_instant(bad)


@pytest.mark.parametrize(("local", "zone", "utc"), [
    ("2026-12-01T09:00:00", "Europe/Bucharest", "2026-12-01T07:00:00.000Z"),
    # spring-forward gap: 03:30 does not exist, moves forward by the gap to 04:30 EEST
    ("2026-03-29T03:30:00", "Europe/Bucharest", "2026-03-29T01:30:00.000Z"),
    # fall-back fold: 03:30 exists twice, the first (EEST) is taken
    ("2026-10-25T03:30:00", "Europe/Bucharest", "2026-10-25T00:30:00.000Z"),
    ("2026-03-08T02:30:00", "America/New_York", "2026-03-08T07:30:00.000Z"),
    ("2026-11-01T01:30:00", "America/New_York", "2026-11-01T05:30:00.000Z"),
])
def test_local_time_gap_and_fold_rules(local: str, zone: str, utc: str) -> None:
    assert format_ms(parse_local_time(local, zone)) == utc


def test_local_time_rejects_offsets_and_unknown_zones() -> None:
    with pytest.raises(TimeFormatError):
        parse_local_time("2026-12-01T09:00:00+01:00", "Europe/Paris")
    with pytest.raises(TimeFormatError):
        parse_local_time("2026-12-01T09:00:00", "Mars/Olympus")
    # the first and last years are refused in every zone, saying which years are taken
    for first_or_last in ("0001-06-01T00:00:00", "9999-06-01T00:00:00"):
        with pytest.raises(TimeFormatError, match="years 2 to 9998"):
            parse_local_time(first_or_last, "Asia/Tokyo")
    assert format_ms(parse_local_time("9998-12-31T23:00:00", "Asia/Tokyo")) == (
        "9998-12-31T14:00:00.000Z")


def test_a_ttl_never_passes_cassandras_twenty_years() -> None:
    """A pace's slot decades ahead (a slow campaign of many messages) must not ask Cassandra
    for a TTL it refuses: the write would fail, and every take of its topic with it."""
    now = 1_800_000_000_000
    assert timeline.ttl_s(now + 3_600_000, now, 7) == 3600 + 7 * 86_400
    assert timeline.ttl_s(now + 30 * 365 * 86_400_000, now, 7) == timeline.MAX_TTL_S == 630_720_000


def test_parts_cap_partition_size() -> None:
    cap = 1000
    slots = range(10_000)
    parts: dict[int, int] = {}
    for slot in slots:
        part = timeline.part_of(slot, cap)
        parts[part] = parts.get(part, 0) + 1
    assert max(parts.values()) == cap
    assert timeline.parts_for(10_000, cap) == len(parts) == 10
    assert timeline.parts_for(0, cap) == 0 and timeline.parts_for(1, cap) == 1


def test_placement_never_behind_writer_clock() -> None:
    assert timeline.placement_ms(due_ms=5, now_ms=100) == 100
    assert timeline.placement_ms(due_ms=500, now_ms=100) == 500


def test_backoff_grows_and_caps() -> None:
    assert [timeline.retry_backoff_ms(a, 1, 600) for a in (1, 2, 3)] == [1000, 2000, 4000]
    assert timeline.retry_backoff_ms(30, 1, 600) == 600_000


def test_shards_are_stable_and_spread() -> None:
    shards = [timeline.shard_of(f"m{i}", 16) for i in range(16_000)]
    assert timeline.shard_of("m1", 16) == timeline.shard_of("m1", 16)
    counts = [shards.count(s) for s in range(16)]
    assert min(counts) > 800 and max(counts) < 1200


def test_server_ids_are_time_ordered_and_valid() -> None:
    ids = [new_message_id(1_700_000_000_000 + i) for i in range(100)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 100
    assert all(CLIENT_ID.match(i) for i in ids)


def test_server_ids_carry_their_home_and_the_home_fixes_the_shard() -> None:
    homes = homes_for_request(16)
    assert [h % 16 for h in homes] == list(range(16))
    assert all(0 <= h < EMBEDDED_HOMES for h in homes)
    for home in (0, 1, homes[5], EMBEDDED_HOMES - 1):
        made = new_message_id(1_700_000_000_000, home)
        assert home_of(made) == home
        assert timeline.shard_of(made, 16) == home % 16
        assert timeline.shard_of(made, 10) == home % 10
    with pytest.raises(ValueError):
        new_message_id(1_700_000_000_000, EMBEDDED_HOMES)


def test_other_ids_hash_onto_homes_inside_their_shard() -> None:
    ids = [f"user-{i}" for i in range(25_600)]
    homes = [home_of(i) for i in ids]
    assert set(homes) == set(range(HASHED_HOMES))
    assert max(homes.count(h) for h in range(HASHED_HOMES)) < 160  # about 100 each
    # with a power-of-two shard count a home never spans shards
    assert all(home_of(i) % 16 == timeline.shard_of(i, 16) for i in ids)
    assert home_of("imp-" + "a" * 32) < HASHED_HOMES
    assert home_of("01arz3ndektsv4rrffq69g5fav") < HASHED_HOMES  # lower case: not ULID-shaped


def test_fair_share_splits_slots_evenly_and_covers_them_all() -> None:
    members = ["a", "b", "c"]
    shares = [fair_share(members, m, 64) for m in members]
    assert sorted(shares) == [21, 21, 22] and sum(shares) == 64
    assert fair_share([], "solo", 64) == 64
    assert fair_share(["x"], "y", 3) + fair_share(["y"], "x", 3) == 3


def test_release_slot_is_stable_and_in_range() -> None:
    slots = {release_slot_of("6f1c0b2e-0000-4000-8000-000000000000", s, 64) for s in range(16)}
    assert all(0 <= s < 64 for s in slots) and len(slots) > 1
    assert release_slot_of("t", 3, 64) == release_slot_of("t", 3, 64)


def test_config_rejects_a_look_ahead_beyond_the_counted_writes() -> None:
    with pytest.raises(ConfigError):
        load_config({"DUETIME_RELEASE_LOOKAHEAD_MS": "9500"})
    assert load_config({"DUETIME_RELEASE_LOOKAHEAD_MS": "9000"}).release_lookahead_ms == 9000


def test_server_ids_of_a_request_share_homes_with_the_messages_due_next_to_them() -> None:
    payload = Payload(b"{}", "json", {})
    dues = [5_000 - 10 * (n % 100) + n // 100 for n in range(1000)]  # not in due order
    items = [NewMessage(None, due, 100, None, payload, "h") for due in dues]
    homes = home_by_due_time(items, 16)
    assert len(set(homes)) == 16 and {h % 16 for h in homes} == set(range(16))
    by_due = [homes[n] for n in sorted(range(1000), key=lambda n: dues[n])]
    runs = [by_due[i:i + 63] for i in range(0, 1000, 63)]
    assert all(len(set(run)) == 1 for run in runs)  # adjacent due times, one home
    assert max(Counter(homes).values()) == 63


def test_a_small_requests_messages_land_on_every_shard_alike() -> None:
    payload = Payload(b"{}", "json", {})
    shards: Counter[int] = Counter()
    for _ in range(3200):
        homes = home_by_due_time([NewMessage(None, 1000, 100, None, payload, "h")], 16)
        shards[homes[0] % 16] += 1
    assert set(shards) == set(range(16))  # one message: any shard, none favoured
    assert max(shards.values()) < 2 * 200 and min(shards.values()) > 200 / 2


def test_a_fair_queue_takes_turns_across_groups_after_priority() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(5):
        queue.push(f"a{n}", "a", order=n)
    queue.push("b0", "b", order=100)
    queue.push("urgent", None, priority=1)
    queue.push("first", "a", order=-1)  # each group in its own order
    assert [queue.pop() for _ in range(3)] == ["first", "b0", "a0"]
    queue.push("c0", "c")  # a late group joins the round being served, not round 0
    assert [queue.pop() for _ in range(len(queue))] == [
        "c0", "a1", "a2", "a3", "a4", "urgent"]


def test_nesting_counts_arrays_and_objects_without_recursion() -> None:
    assert nesting(1) == 0 and nesting([]) == 1 and nesting({"a": [1, {"b": []}]}) == 4
    deep: list[object] = []
    for _ in range(50_000):  # far past any recursion limit
        deep = [deep]
    assert nesting(deep) == 50_001


def test_a_progress_bar_in_a_log_writes_a_line_at_most_every_interval() -> None:
    import io

    from duetime_client.progress import ProgressBar, bar

    assert bar(61, 100, width=10) == "[######....]  61% 61/100"
    assert bar(12_000, 10_000, width=4) == "[####] 100% 12,000/10,000"
    assert bar(7, None) == "7 done"
    log = io.StringIO()
    progress = ProgressBar(log, every_s=3600)
    for done in range(5):
        progress.show("cancel c", done, 4)
    progress.finish("cancel c succeeded")
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in log.getvalue()
    assert lines[0].startswith("cancel c [") and lines[1].startswith("cancel c succeeded")


def test_a_progress_bar_writes_its_first_line_at_once_on_a_host_just_booted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import types

    from duetime_client import progress as progress_module

    # this module's clock only: other threads of the run keep the real one
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(monotonic=lambda: 5.0))
    log = io.StringIO()
    progress_module.ProgressBar(log, every_s=60).show("import", 1, 10)
    assert log.getvalue().startswith("import [")


def test_a_restored_message_keeps_its_state_and_waits_no_earlier_than_now() -> None:
    import uuid as uuid_module

    from app.core.ids import home_of
    from app.models import Topic, TopicSettings
    from spark.rows import ImportSettings, Reject, restored

    topic = Topic("tenant", "t", uuid_module.uuid4(), TopicSettings(shards=4), "s", 0, 0)
    now = 1_800_000_000_000
    settings = ImportSettings(topic, None, now, 65536, 365, 7, 60_000)
    exported = {"id": "m-1", "state": "leased", "deliver_at": now - 9000, "due_at": now - 5000,
                "priority": 3, "campaign": "c", "group": "g", "attempts": 2,
                "last_error": "boom", "created_at": now - 10_000, "updated_at": now - 9000,
                "payload": bytearray(b'{"a":1}'), "encoding": "json", "headers": None,
                "content_hash": "h"}
    row = restored(exported, settings)
    assert (row["state"], row["due_at"], row["attempts"], row["last_error"]) == (
        "scheduled", now, 2, "boom")
    assert row["home"] == home_of("m-1") and 0 <= row["shard"] < 4
    later = restored({**exported, "state": "scheduled", "due_at": now + 60_000}, settings)
    assert later["due_at"] == now + 60_000 and later["deliver_at"] == now - 9000
    dead = restored({**exported, "state": "dead"}, settings)
    assert (dead["state"], dead["due_at"]) == ("dead", now - 5000)
    # a paused one stays paused at its due time, its row living as long as its payload
    paused = restored({**exported, "state": "paused"}, settings)
    assert (paused["state"], paused["due_at"]) == ("paused", now - 5000)
    assert paused["ttl"] == paused["payload_ttl"] > dead["ttl"]
    for broken in ({**exported, "state": "lost"}, {**exported, "payload": None},
                   {**exported, "id": "bad id"}):
        with pytest.raises(Reject):
            restored(broken, settings)


def test_a_read_of_more_partitions_than_merge_goes_run_by_run_in_due_order() -> None:
    """A read (app.delivery.scan._Reads) over one lane of one bucket with more partitions than
    are merged at once (MERGE_WIDTH): within a run the pointers come in due order, whichever
    partition holds them; the next run is opened once the first is read; a quota stops the
    read, and only partitions read to their end count as whole."""
    import uuid
    from types import SimpleNamespace
    from typing import Any

    from app.delivery.scan import MERGE_WIDTH, SpentPointers, _LaneReader, _Reads
    from app.models import Pointer

    count = MERGE_WIDTH + 8

    def pointers(i: int) -> Any:
        for due in (1000 + i, 5000 + i):
            yield Pointer(due, f"m{i}-{due}", 1, 0, i)

    def read(quota: int) -> Any:
        pages = iter([(i, pointers(i)) for i in range(count)])
        reader = _LaneReader(list(range(count)), [7] * count, pages)
        scanner: Any = SimpleNamespace(spent=SpentPointers())
        topic: Any = SimpleNamespace(uid=uuid.uuid4())
        reads = _Reads(scanner, topic, quota, lambda key: False)
        reads.run(reader, quota)
        return reads

    first_run = [1000 + i for i in range(MERGE_WIDTH)] + [5000 + i for i in range(MERGE_WIDTH)]
    whole = read(4 * count)
    assert [p.due_at_ms for p in whole.unknown[:2 * MERGE_WIDTH]] == first_run
    assert len(whole.unknown) == 2 * count
    assert all(whole.progress[i].whole for i in range(count))
    cut = read(MERGE_WIDTH + 1)
    assert [p.due_at_ms for p in cut.unknown] == first_run[:MERGE_WIDTH + 1]
    assert not any(state.whole for state in cut.progress.values())


class Indexes:
    """The write counts of topics, as given; and the reads made of them (the walk's read of
    many topics' counts at once)."""

    def __init__(self) -> None:
        self.counts: dict[uuid.UUID, dict[tuple[int, int], int]] = {}
        self.reads: list[tuple[int, int]] = []

    def write_counts_in(self, groups: list[tuple[list[uuid.UUID], list[int]]]
                        ) -> dict[uuid.UUID, dict[tuple[int, int], int]]:
        found: dict[uuid.UUID, dict[tuple[int, int], int]] = {}
        for topic_uids, buckets in groups:
            self.reads.append((len(topic_uids), len(buckets)))
            found.update({t: {k: n for k, n in self.counts.get(t, {}).items()
                              if k[0] in buckets} for t in topic_uids if t in self.counts})
        return found


def test_the_counts_of_many_topics_are_read_together_each_read_bounded() -> None:
    indexes = Indexes()
    window = [998, 999, 1000]
    topics = [uuid.uuid4() for _ in range(100)]
    for n, t in enumerate(topics):
        indexes.counts[t] = {(999, 0): n, (990, 1): 5}  # 990: outside the window, not read
    lone = uuid.uuid4()  # more buckets than one read holds: read alone
    indexes.counts[lone] = {(b, 0): 1 for b in range(200)}
    found = count_reads.read_counts(indexes, {**dict.fromkeys(topics, window),
                                              lone: list(range(200)), uuid.uuid4(): []})
    assert found[topics[7]] == {(999, 0): 7} and len(found[lone]) == 200
    assert set(found) == {*topics, lone}
    assert sum(n for n, _ in indexes.reads) == len(topics) + 1
    assert all(n * b <= count_reads.COUNT_CELLS for n, b in indexes.reads if n > 1)
    assert (1, 200) in indexes.reads
    assert count_reads.read_counts(indexes, {}) == {}


def test_a_walk_reads_a_new_topic_from_its_cursors_then_only_what_moved_or_nears_the_end(
) -> None:
    walk = Walk.starting_at({0: 1_000, 1: 2_000})
    assert walk.starts({}, 60_000, 1_500, 1_000) == {0: 1_000, 1: 2_000}  # never read
    walk.record(10_000, {0: 1_000, 1: 2_000}, {0: 15_000, 1: 15_000}, 15_000, [0],
                {(0, 0): 3}, set())
    assert walk.position == {0: 15_000, 1: 15_000} and walk.cells == {(0, 0): 3, (0, 1): None}
    assert walk.starts({(0, 0): 3}, 15_100, 1_500, 1_000) == {}  # nothing moved, far from end
    # shard 1's first count since: read again from the safety lag before the last read began
    assert walk.starts({(0, 0): 3, (0, 1): 1}, 15_100, 1_500, 1_000) == {1: 9_000}
    assert walk.starts({(0, 0): 4}, 15_100, 1_500, 1_000) == {0: 9_000}  # written to
    assert walk.starts({(0, 0): 3, (0, 7): 2}, 15_100, 1_500, 1_000) == {}  # not an owned shard
    # the window's end came within the refill of the positions: read on from there
    assert walk.starts({(0, 0): 3}, 16_500, 1_500, 1_000) == {0: 15_000, 1: 15_000}


def test_a_walk_keeps_unrecorded_what_was_cut_short_or_still_in_flight() -> None:
    walk = Walk.starting_at({0: 0, 1: 0, 2: 0})
    walk.record(5_000, {0: 0, 1: 0, 2: 0}, {0: 10_000, 1: 7_000, 2: 10_000}, 10_000, [0, 1],
                {(0, 0): 2, (1, 0): 1, (0, 1): 5, (0, 2): 1}, incomplete={(0, 2)})
    # shard 1 stopped short of the end; shard 2 had a row in flight in bucket 0
    assert walk.position == {0: 10_000, 1: 7_000, 2: 10_000}
    assert walk.cells == {(0, 0): 2, (1, 0): 1, (1, 2): None}
    assert walk.starts({(0, 0): 2, (1, 0): 1, (0, 1): 5, (0, 2): 1}, 10_100, 1_500, 1_000) == {
        1: 4_000, 2: 4_000}


def test_a_walk_passes_an_empty_window_without_a_read_but_never_a_stretch_behind_it() -> None:
    walk = Walk.starting_at({0: 1_000})
    assert not walk.passed_empty(70_000, 75_000, 10_000)  # never read: its cursor may be far
    walk.record(70_000, {0: 1_000}, {0: 75_000}, 75_000, [1], {}, set())
    assert walk.passed_empty(72_000, 77_000, 12_000) and walk.position == {0: 77_000}
    assert walk.read_at == 72_000  # a write after this moves a count: read from before it
    cut = Walk.starting_at({0: 1_000})
    cut.record(70_000, {0: 1_000}, {0: 5_000}, 75_000, [1], {}, set())
    assert not cut.passed_empty(72_000, 77_000, 12_000) and cut.position == {0: 5_000}


def test_a_walks_cursor_trails_its_position_the_safety_lag_and_what_it_holds() -> None:
    walk = Walk.starting_at({0: 0, 1: 0, 2: 0})
    walk.record(20_000, {0: 0, 1: 0, 2: 0}, {0: 25_000, 1: 3_000, 2: 25_000}, 25_000, [0],
                {}, set())
    moves = walk.cursor_moves(20_000, 1_000, {2: 12_000}, 5_000)
    assert moves == {0: 19_000, 2: 12_000}  # shard 1's position moved less than a step
    assert walk.cursor == {0: 19_000, 1: 0, 2: 12_000}
    assert walk.cursor_moves(21_000, 1_000, {2: 12_000}, 5_000) == {}  # recorded as made


def test_a_lane_with_a_backlog_keeps_a_position_of_its_own_and_holds_nothing_back() -> None:
    """A read the quota stopped in one lane (a backlog) leaves that lane a position of its
    own; its shard moves on for the other lanes, and is read again for the lane alone while
    the lane is not closed (its room used up). A closed lane stays where its shard was; a
    lane read whole follows its shard again. No cursor passes a lane's position."""
    walk = Walk.starting_at({0: 1_000, 1: 1_000})
    walk.record(10_000, {0: 1_000, 1: 1_000}, {0: 15_000, 1: 15_000}, 15_000, [0], {},
                set(), lanes_ms={(0, 7): 4_000})
    assert walk.position == {0: 15_000, 1: 15_000} and walk.lanes == {(0, 7): 4_000}
    assert walk.lowest(0) == 4_000 and walk.lowest(1) == 15_000
    # far from the window's end, but the lane is behind: shard 0 is read (the lane from 4 s)
    assert walk.starts({}, 15_100, 1_500, 1_000) == {0: 15_000}
    assert walk.starts({}, 15_100, 1_500, 1_000, closed=frozenset({(0, 7)})) == {}
    # a closed lane not behind yet is pinned where its shard's position was
    walk.record(11_000, {0: 15_000, 1: 15_000}, {0: 16_000, 1: 16_000}, 16_000, [0], {},
                set(), lanes_ms={(0, 7): 6_000}, closed=frozenset({(1, 3)}))
    assert walk.lanes == {(0, 7): 6_000, (1, 3): 15_000}
    assert walk.cursor_moves(30_000, 1_000, {}, 1_000) == {0: 6_000, 1: 15_000}
    # read whole: both follow their shards again
    walk.record(12_000, {0: 16_000, 1: 16_000}, {0: 17_000, 1: 17_000}, 17_000, [0], {}, set())
    assert walk.lanes == {} and walk.lowest(0) == 17_000
    # a window with nothing in it is not passed while a lane is behind its start
    walk.record(13_000, {0: 17_000}, {0: 18_000}, 18_000, [0], {}, set(),
                lanes_ms={(0, 2): 2_000})
    assert not walk.passed_empty(20_000, 25_000, 10_000)


def test_a_closed_lane_is_read_later_from_where_its_shards_read_began() -> None:
    """A write due now lands behind the shard's position and moves its count: the shard is
    read again from the safety lag before the last read. A lane closed then (the broker
    holds enough of it) was not read from there, so it keeps that start, not the position,
    and is read from it once it opens: nothing written to it meanwhile is passed."""
    walk = Walk.starting_at({0: 1_000})
    walk.record(10_000, {0: 1_000}, {0: 15_000}, 15_000, [0], {(0, 0): 128}, set())
    assert walk.starts({(0, 0): 140}, 15_100, 1_500, 1_000) == {0: 9_000}
    walk.record(10_500, {0: 9_000}, {0: 15_500}, 15_500, [0], {(0, 0): 140}, set(),
                closed=frozenset({(0, 0)}))
    assert walk.lanes == {(0, 0): 9_000} and walk.lowest(0) == 9_000
    assert walk.starts({(0, 0): 140}, 15_600, 1_500, 1_000, closed=frozenset({(0, 0)})) == {}
    assert walk.starts({(0, 0): 140}, 15_600, 1_500, 1_000) == {0: 15_500}  # opened
    # closed again by a later read that began even earlier: the earlier start holds
    walk.record(11_000, {0: 8_000}, {0: 16_000}, 16_000, [0], {(0, 0): 141}, set(),
                closed=frozenset({(0, 0)}))
    assert walk.lanes == {(0, 0): 8_000}
    assert walk.cursor_moves(30_000, 1_000, {}, 1_000) == {0: 8_000}


def test_a_walk_forgets_the_counts_of_buckets_its_window_left_behind() -> None:
    walk = Walk.starting_at({0: 0})
    walk.record(1_000, {0: 0}, {0: 70_000}, 70_000, [0, 1], {(0, 0): 4, (1, 0): 2}, set())
    walk.record(65_000, {0: 70_000}, {0: 130_000}, 130_000, [1, 2], {(1, 0): 2}, set())
    assert walk.cells == {(1, 0): 2, (2, 0): None}


def test_count_reads_group_topics_within_a_hundred_cells() -> None:
    two = {uuid.uuid4(): [1, 2] for _ in range(120)}
    groups = count_groups({**two, uuid.uuid4(): [], uuid.uuid4(): list(range(300))})
    assert sum(len(uids) for uids, _ in groups) == 121  # the topic without buckets reads none
    assert all(len(uids) * len(buckets) <= count_reads.COUNT_CELLS
               for uids, buckets in groups if len(uids) > 1)
    assert [len(uids) for uids, _ in groups if len(uids) > 1] == [50, 50, 20]


def test_the_cluster_clock_corrects_an_offset_past_its_tolerance_and_keeps_it_in_an_outage(
        ) -> None:
    local, behind, down = [1_000_000_000], [20_000], [False]

    def cassandra_now_ms() -> int:
        if down[0]:
            raise StoreUnavailable("Cassandra unavailable")
        return local[0] + behind[0]

    clock = ClusterClock(lambda: local[0], cassandra_now_ms, tolerance_ms=500)
    assert clock.now() == local[0] + 20_000  # measured at the first call: 20 s behind
    behind[0] = 300  # within the tolerance, but not measured again before a minute
    local[0] += 59_000
    assert clock.now() == local[0] + 20_000
    local[0] += 1_000
    assert clock.now() == local[0]  # measured again: within the tolerance, no correction
    behind[0], down[0] = -4_000, True  # ahead now, but Cassandra is down: the offset stays
    local[0] += 60_000
    assert clock.now() == local[0]
    down[0] = False
    local[0] += 1_000
    assert clock.now() == local[0]  # a failed measurement is tried again after 5 s only
    local[0] += 4_000
    assert clock.now() == local[0] - 4_000 and clock.skew_ms() == 4_000


def test_the_first_n_in_fair_order_are_found_without_ordering_the_rest() -> None:
    """fair_first(due, n) is fair_order(due)[:n] for any mix of priorities, groups (one with
    a backlog), campaigns and ties of due time, for n from 1 to past the whole."""
    rng = __import__("random").Random(7)
    uid = uuid.uuid4()
    for trial in range(60):
        due = []
        for i in range(rng.randint(0, 300)):
            at = 1_000_000 + rng.randint(0, 50) * 10
            group = rng.choice([None, "big", "big", "big", "a", "b", f"g{i % 7}"])
            row = MessageState(uid, f"m{trial}-{i}", "scheduled", 1, at, at, rng.choice([0, 0, 1]),
                               rng.choice([None, "c1"]), i % 4, 0, "h", None, None, None, None,
                               at, at, group=group)
            due.append(Due(Pointer(at, row.id, 1, row.priority, row.shard), row))
        for n in (1, 2, 8, 50, len(due), len(due) + 5):
            assert fair_first(due, n) == fair_order(due)[:n], (trial, n)


def test_counts_that_stand_move_a_walks_read_forward_never_back() -> None:
    walk = Walk.starting_at({0: 100})
    walk.read_at = 500
    walk.counts_stood(400)
    assert walk.read_at == 500
    walk.counts_stood(900)
    assert walk.read_at == 900 and walk.position == {0: 100}


def _held_at_random(rng: random.Random, trial: int) -> tuple[HeldMessages, dict[PointerKey, Due]]:
    """HeldMessages after random adds, removes and re-adds of scheduled messages and leased
    ones (their lease running or over), of several priorities, groups and shards, delivered
    at or before their due time; and what a plain dict of the same steps holds."""
    uid = uuid.uuid4()
    held = HeldMessages(uid)
    kept: dict[PointerKey, Due] = {}
    for step in range(rng.randint(1, 400)):
        if kept and rng.random() < 0.3:
            key = rng.choice(list(kept))
            held.remove(key)
            del kept[key]
            continue
        at = 1_000_000 + rng.randint(0, 3000)
        leased = rng.random() < 0.2
        row = MessageState(uid, f"m{trial}-{rng.randint(0, 300)}",
                           "leased" if leased else "scheduled", 1, at,
                           at - rng.choice([0, 0, rng.randint(0, 2000)]), rng.randint(0, 1),
                           None, step % 4, rng.randint(0, 3), "h", None,
                           at if leased else None, None, None, at, at,
                           group=rng.choice([None, "a", "b"]))
        d = Due(Pointer(at, row.id, 1, 0, row.shard), row)
        key = pointer_key(uid, row.id, 1)
        held.add(key, d)
        kept.setdefault(key, d)
    return held, kept


def _round_kind(d: Due) -> str:
    """What a round does with a message (as the broker's _sorter says), by its attempts."""
    return ("hand", "hand", "end", "pass")[d.row.attempts]


def _check_firsts(held: HeldMessages, kept: dict[PointerKey, Due], now: int) -> None:
    """HeldMessages.firsts against each turn group's live messages in the group's order."""
    for n in (1, 3, 50):
        found = held.firsts(now, n, _round_kind)
        for group in {turn_group(d) for d in kept.values()}:
            live = sorted((d for d in kept.values() if turn_group(d) == group
                           and is_live(d.pointer, d.row, now)), key=group_place)
            hand = [d for d in live if _round_kind(d) == "hand"][:n]
            before = live[:live.index(hand[-1]) + 1] if len(hand) == n else live
            for kind in ("hand", "end", "pass"):
                assert ([d for d in found[kind] if turn_group(d) == group]
                        == [d for d in before if _round_kind(d) == kind])


def _pointer_of(d: Due) -> tuple[str, int]:
    return d.pointer.id, d.pointer.version


def tracked_within(root: object) -> int:
    """How many objects the collector tracks among what root's attributes hold, however
    deep (types, modules and functions not followed): what holding costs a full collection,
    whatever other threads of the process allocate meanwhile."""
    seen: set[int] = set()
    stack = list(vars(root).values())
    count = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        count += gc.is_tracked(obj)
        stack.extend(gc.get_referents(obj))
    return count


def test_held_messages_give_back_each_row_whole_and_leave_the_collector_nothing_to_track(
        ) -> None:
    """A held message comes back equal to what was added, every field set (its lease token
    and last operation UUIDs too), and holding a thousand adds almost nothing to what
    Python's collector tracks: a full collection stops the releaser for as long as it
    takes to walk those."""
    uid = uuid.uuid4()
    held = HeldMessages(uid)
    row = MessageState(uid, "m1", "leased", 7, 1_000, 900, 3, "spring", 5, 2, "h1",
                       uuid.uuid4(), 31_000, "worker-1", "HTTP 500", 100, 200,
                       last_op=uuid.uuid4(), paced=True, group="g1")
    d = Due(Pointer(31_000, "m1", 7, 3, 5, 2), row)
    held.add(pointer_key(uid, "m1", 7), d)
    assert held.get(pointer_key(uid, "m1", 7)) == d
    assert held.items() == [(pointer_key(uid, "m1", 7), d)]
    gc.collect()
    before = tracked_within(held)
    for i in range(1_000):
        held.add(pointer_key(uid, f"n{i}", 1), Due(
            Pointer(2_000 + i, f"n{i}", 1, 0, i % 16),
            dataclasses.replace(row, id=f"n{i}", version=1, lease_token=uuid.uuid4())))
    gc.collect()
    added = tracked_within(held) - before
    assert added < 300, added  # 3,000 and more when each is a Due, its Pointer and its row
    assert len(held) == 1_001
    assert held.get(pointer_key(uid, "n999", 1)).row.lease_token is not None


def test_held_messages_give_what_is_ready_in_order_and_the_next_moment_as_a_full_pass_would(
        ) -> None:
    """HeldMessages.ready_by, firsts, next_moment and earliest, which pass over what is held
    only up to what they need, agree with a pass over everything held (_held_at_random)."""
    rng = random.Random(11)
    for trial in range(40):
        held, kept = _held_at_random(rng, trial)
        for now in (999_000, 1_000_000, 1_001_500, 1_003_000, 1_004_000):
            for until in (now, now + 200):
                expected = [d for d in kept.values()
                            if max(d.row.due_at_ms, d.row.lease_expires_at_ms or 0) <= until]
                found = held.ready_by(until)
                assert sorted(found, key=_pointer_of) == sorted(expected, key=_pointer_of)
                readies = [max(d.row.due_at_ms, d.row.lease_expires_at_ms or 0) for d in found]
                assert readies == sorted(readies)
            _check_firsts(held, kept, now)
            after = [at for d in kept.values() if (at := ready_ms(d.row)) > now]
            assert held.next_moment(now) == min(after, default=None), (trial, now)
        assert len(held) == len(kept)
        earliest: dict[int, int] = {}
        for d in kept.values():
            earliest[d.pointer.shard] = min(earliest.get(d.pointer.shard, d.pointer.due_at_ms),
                                            d.pointer.due_at_ms)
        assert held.earliest() == earliest and held.shards() == set(earliest)


def test_an_answer_from_a_process_of_another_version_is_read() -> None:
    """broker_wire: a row with a field this version does not know (a newer sender) or
    without one it knows that has a default (an older sender) is read, not refused."""
    import uuid

    from app.delivery import broker_wire
    from app.models import MessageState, Payload

    row = MessageState(uuid.uuid4(), "m", "leased", 2, 5, 1, 0, None, 0, 1, "h", uuid.uuid4(),
                       5, None, None, 1, 1, labels={"k": "v"})
    line = broker_wire.encode_got(7, [broker_wire.Taken(0, None, row, Payload(b"1", "json", {}),
                                                        1)])
    message = broker_wire.decode_line(line)
    message["messages"][0]["row"]["from_a_newer_version"] = 1
    del message["messages"][0]["row"]["labels"]
    want_id, [taken] = broker_wire.decode_got(message)
    assert want_id == 7 and taken.leased.id == "m" and taken.leased.labels is None
    assert taken.leased.lease_token == row.lease_token


def test_a_line_cut_before_its_newline_is_not_read() -> None:
    """broker_wire: an answer whose last byte (its newline) was not sent is refused, though
    what came is JSON: its sender gave back what it carried (a reader taking it would hand
    those messages out twice)."""
    import pytest

    from app.delivery import broker_wire

    line = broker_wire.encode_withdraw(3)
    assert broker_wire.decode_line(line) == {"withdraw": 3}
    with pytest.raises(ValueError):
        broker_wire.decode_line(line[:-1])
