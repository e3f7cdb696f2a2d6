"""Frequency caps across processes (issue 85, docs/design.md "Frequency caps"): a capped pull
topic served by a gunicorn API of two workers and two releaser processes, consumers leasing
one at a time over HTTP, one releaser and then one API worker SIGKILLed mid-way: from the
recorded lease answers, exactly `max` per recipient, none early, every other message
deferred to the recipient's next local midnight in the recipient's own zone (three zones).
Every process of the stack runs on a clock moved (DUETIME_CLOCK_OFFSET_MS) to the next day
on which America/New_York changes between standard and daylight saving time, after the
change: that zone's local day lasts 23 or 25 h, and its deferrals go to its midnight at the
day's true end. tests/test_frequency_caps.py covers days across a DST change in one
process, the clock given."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from app.config import Config
from app.core.frequency_cap import next_midnight
from app.core.timeparse import from_ms
from tests.consumers import now_ms
from tests.faults.stack import children
from tests.releasers.test_contract import SLOTS, _Http, _kill_with_children, _served_stack, _wait

CAP_PORT = 18094
DST_ZONE = "America/New_York"  # its DST changes at 02:00 local: 06:00 or 07:00 UTC
ZONES = ("UTC", "Europe/Berlin", DST_ZONE)  # 15:00 UTC is 10:00-11:00 there, 16:00-17:00 in Berlin
AT_UTC = dt.time(15, 0)
DAY_MS = 86_400_000


@pytest.fixture()
def ring() -> dict[str, Any]:
    """A ring of release slots of this test's own."""
    return {"release_ring": 7500 + int(time.time() * 1000) % 400, "release_slots": SLOTS}


@pytest.fixture()
def members(services: Any) -> Iterator[list[str]]:
    """This test's releasers. Their clock reports (app.store.clocks) carry the moved clock's
    skew and are kept 60 s (a killed one never takes its own back): a later test of this
    keyspace would read them as a live releaser's, so they go at the end."""
    names = ["cap-a", "cap-b"]
    yield names
    for name in names:
        services.clocks.forget(name)


def _day_start(tz: ZoneInfo, at_ms: int) -> int:
    """The local midnight that began tz's calendar day of at_ms (epoch ms; America/New_York
    and the others here never skip or repeat a midnight)."""
    day = from_ms(at_ms).astimezone(tz).date()
    return int(dt.datetime.combine(day, dt.time(), tzinfo=tz).timestamp() * 1000)


def _on_next_dst_day() -> int:
    """AT_UTC (epoch ms) on the first date after today (UTC) whose DST_ZONE day is not 24 h
    long. Always ahead of the host's clock: a process whose clock is behind Cassandra's
    would take the pointers of its messages due now for late writes and place them again at
    Cassandra's time (app.messages.placement.PointerPlacer.again_if_late)."""
    tz = ZoneInfo(DST_ZONE)
    day = from_ms(now_ms()).date()
    for _ in range(400):
        day += dt.timedelta(days=1)
        at = int(dt.datetime.combine(day, AT_UTC, tzinfo=dt.UTC).timestamp() * 1000)
        start = _day_start(tz, at)
        if next_midnight(tz, start) - start != DAY_MS:
            return at
    raise AssertionError(f"{DST_ZONE} has no DST change in the next 400 days")


def _on_a_dst_day(at_ms: int) -> tuple[int, int]:
    """Checks that at_ms lies on a DST_ZONE day of 23 or 25 h, after its change, and in the
    middle of the other zones' days (each zone's deferrals all go to one midnight): that
    day's (start, end), epoch ms."""
    for z in ZONES:
        assert dt.time(1, 0) <= from_ms(at_ms).astimezone(ZoneInfo(z)).time() <= dt.time(22, 30)
    dst = ZoneInfo(DST_ZONE)
    start, end = _day_start(dst, at_ms), next_midnight(dst, at_ms)
    assert end - start in (DAY_MS - 3_600_000, DAY_MS + 3_600_000), (start, end)
    offsets = [from_ms(t).astimezone(dst).utcoffset() for t in (start, at_ms, end)]
    assert offsets[0] != offsets[1] == offsets[2], offsets  # the change is behind at_ms
    return start, end


def _settled(rows: dict[str, Any], now: int, recipients: int) -> bool:
    """Whether 2 per recipient are delivered and the other 3 are deferred to a later day."""
    states = Counter(r.state if r.state != "scheduled" or r.due_at_ms > now + 3_600_000
                     else "due" for r in rows.values())
    return states["delivered"] == 2 * recipients and states["scheduled"] == 3 * recipients


def _kill_mid_way(handed: list[Any], api_pid: int, releaser_pid: int) -> tuple[int, int, int]:
    """SIGKILL the releaser after 600 hand-outs, then one gunicorn worker (not the master:
    it starts another) after 1,200: (when the releaser was killed, when the worker was,
    epoch ms; the worker's pid)."""
    _wait(lambda: len(handed) >= 600, 120, "too little was handed out")
    _kill_with_children(releaser_pid)
    releaser_killed_at = now_ms()
    _wait(lambda: len(handed) >= 1200, 120, "the releaser left did not take over")
    workers = children(api_pid)
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    return releaser_killed_at, now_ms(), workers[0]


def test_two_releasers_one_killed_hand_out_exactly_the_cap_per_recipient(
        config: Config, services: Any, ring: dict[str, Any], members: list[str]) -> None:
    """1,000 recipients x 5 messages due now, each recipient in one of three zones, a cap of
    2 a day; every process (two gunicorn workers, two releasers) on a clock moved to 15:00
    UTC of America/New_York's next DST day (a 23 or 25 h local day), the test's own clock
    moved alike; four consumers lease `max: 1` and ack over HTTP; one releaser is SIGKILLed
    after 600 hand-outs, then one API worker (gunicorn starts another) after 1,200. Every
    recipient is handed exactly 2 (never 3, none twice, none early) and its other 3 wait
    at its next local midnight, New York's at the end of its DST day, with no attempt
    spent. A claim the killed releaser left (claimed, its take never run) costs no
    recipient its second send: the releaser left takes it over within the claim grace
    (app.delivery.frequency_caps.CLAIM_GRACE_MS, 10 s); a lease answer lost with the
    killed worker runs out (lease_seconds 5) and is handed out again, in its recipient's
    slot; the wait below allows for both. Only the answers received are recorded."""
    offset_ms = _on_next_dst_day() - now_ms()

    def clock() -> int:  # the served stack's clock
        return now_ms() + offset_ms

    tenant = f"cap{now_ms()}"
    http = _Http(f"http://127.0.0.1:{CAP_PORT}", services.keys.create(tenant))
    recipients = 1000
    zone_of = {f"r{r:04d}": ZONES[r % 3] for r in range(recipients)}
    ids = [f"{who}-{k}" for who in zone_of for k in range(5)]

    def rows() -> dict[str, Any]:  # the rows' truth: a killed process's counters are lost
        uid = services.topics.get(tenant, "capped").uid
        return services.messages.get_many(uid, ids)

    def settled() -> bool:  # delivered, or deferred to a later day
        # the rows are read only once every hand-out may have come: reading 5,000 rows over
        # and over took the node's CPU and slowed the hand-outs several-fold
        return len(handed) >= 2 * recipients and _settled(rows(), clock(), recipients)

    handed: list[tuple[str, int, int]] = []
    stop = threading.Event()
    consumers = [threading.Thread(target=http.consume, args=("capped", handed, stop, clock),
                                  daemon=True) for _ in range(4)]
    started = clock()
    day_start, day_end = _on_a_dst_day(started)
    # topic_changes are stamped with Cassandra's clock (now()) and followed by the moved one:
    # the releasers would know the new topic only at their next full read of the topics
    moved = {"DUETIME_CLOCK_OFFSET_MS": str(offset_ms), "DUETIME_TOPIC_REFRESH_MS": "1000"}
    with _served_stack(config, ring, members, port=CAP_PORT, extra_env=moved,
                       ready_path="/healthz") as (api_process, releasers):
        assert http.call("PUT", "/v1/topics/capped", {
            "lease_seconds": 5,
            "frequency_cap": {"max": 2, "per": "day", "on_cap": "defer"}}).status in (200, 201)
        for n in range(0, len(ids), 500):
            assert http.call("POST", "/v1/topics/capped/messages:batch", {"messages": [
                {"id": i, "recipient": i.split("-")[0], "timezone": zone_of[i.split("-")[0]],
                 "payload": {}} for i in ids[n:n + 500]]}).status == 200
        for c in consumers:
            c.start()
        try:
            releaser_killed_at, killed_at, worker = _kill_mid_way(
                handed, api_process.pid, releasers[members[0]].pid)
            # a lease answer lost with the killed releaser or worker runs out (5 s) and is
            # handed out again; a claim the releaser left is taken over after the grace (10 s)
            _wait(settled, 240, "not every message was delivered or deferred")
            settled_at = now_ms()
        finally:
            stop.set()
            for c in consumers:
                c.join(15)
        restarted = children(api_process.pid)
        assert len(restarted) == 2 and worker not in restarted, (worker, restarted)
    final = rows()
    received = [h[0] for h in handed]
    assert len(received) == len(set(received)), "a message was handed out twice"
    assert all(deliver_at <= at for _, deliver_at, at in handed), "early"
    per = Counter(i.split("-")[0] for i in received)
    assert len(per) == recipients and set(per.values()) == {2}, per.most_common(3)
    assert {i for i, r in final.items() if r.state == "delivered"} == set(received)
    midnights = {z: next_midnight(ZoneInfo(z), started) for z in ZONES}
    assert midnights[DST_ZONE] == day_end
    for z, midnight in midnights.items():  # the test stayed in one local day of each zone
        assert next_midnight(ZoneInfo(z), clock()) == midnight
    for i, r in final.items():
        if i not in received:
            midnight = midnights[zone_of[i.split("-")[0]]]
            assert (r.state, r.due_at_ms, r.deliver_at_ms, r.attempts) == (
                "scheduled", midnight, midnight, 0), r
            assert r.requested_at_ms is not None and r.requested_at_ms < midnight
    again = sum(r.attempts > 1 for r in final.values())  # answers lost, handed out again
    print(f"on {from_ms(started).isoformat()} ({DST_ZONE}'s day "
          f"{(day_end - day_start) / 3_600_000:.0f} h); settled "
          f"{(settled_at - releaser_killed_at) / 1000:.1f} s after the releaser's kill, "
          f"{(settled_at - killed_at) / 1000:.1f} s after the API worker's; {again} handed "
          f"out again")
