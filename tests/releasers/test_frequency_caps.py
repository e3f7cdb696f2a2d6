"""Frequency caps across processes (issue 85, docs/design.md "Frequency caps"): a capped pull
topic served by a gunicorn API of two workers and two releaser processes, consumers leasing
one at a time over HTTP, one releaser SIGKILLed mid-way: from the recorded lease answers,
exactly `max` per recipient, none early, every other message deferred to the recipient's
next local midnight in the recipient's own zone (three zones). Days across a DST change are
tested in one process with the clock given (tests/test_frequency_caps.py): these processes
run on the host's clock."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from app.config import Config
from app.core.frequency_cap import next_midnight
from tests.consumers import now_ms
from tests.releasers.test_contract import SLOTS, _Http, _kill_with_children, _served_stack, _wait

CAP_PORT = 18094
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "America/Los_Angeles",
         "Asia/Kolkata", "Australia/Sydney")


@pytest.fixture()
def ring() -> dict[str, Any]:
    """A ring of release slots of this test's own."""
    return {"release_ring": 7500 + int(time.time() * 1000) % 400, "release_slots": SLOTS}


def _midday_zones(n: int) -> list[str]:
    """n zones whose local day does not end within the next hour (each zone's deferrals
    all go to one midnight)."""
    now = dt.datetime.now(dt.UTC)
    found = [z for z in ZONES if dt.time(1, 0) <= now.astimezone(ZoneInfo(z)).time()
             <= dt.time(22, 30)]
    assert len(found) >= n, found
    return found[:n]


def test_two_releasers_one_killed_hand_out_exactly_the_cap_per_recipient(
        config: Config, services: Any, ring: dict[str, Any]) -> None:
    """1,000 recipients x 5 messages due now, each recipient in one of three zones, a cap of
    2 a day; four consumers lease `max: 1` and ack over HTTP; one releaser is SIGKILLed
    after 600 hand-outs. Every recipient is handed exactly 2 (never 3, none twice, none
    early) and its other 3 wait at its next local midnight; a claim the killed releaser left
    (claimed, its take never run) costs no recipient its second send: the releaser left
    takes it over within the claim grace (app.delivery.frequency_caps.CLAIM_GRACE_MS, 10 s),
    which the wait below allows for."""
    zones = _midday_zones(3)
    tenant = f"cap{now_ms()}"
    http = _Http(f"http://127.0.0.1:{CAP_PORT}", services.keys.create(tenant))
    recipients = 1000
    zone_of = {f"r{r:04d}": zones[r % 3] for r in range(recipients)}
    ids = [f"{who}-{k}" for who in zone_of for k in range(5)]

    def rows() -> dict[str, Any]:  # the rows' truth: a killed process's counters are lost
        uid = services.topics.get(tenant, "capped").uid
        return services.messages.get_many(uid, ids)

    def settled() -> bool:  # delivered, or deferred to a later day
        states = Counter(r.state if r.state != "scheduled" or r.due_at_ms > now_ms() + 3_600_000
                         else "due" for r in rows().values())
        return states["delivered"] == 2 * recipients and states["scheduled"] == 3 * recipients

    handed: list[tuple[str, int, int]] = []
    stop = threading.Event()
    consumers = [threading.Thread(target=http.consume, args=("capped", handed, stop),
                                  daemon=True) for _ in range(4)]
    started = now_ms()
    with _served_stack(config, ring, ["cap-a", "cap-b"], port=CAP_PORT) as (_, releasers):
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
            _wait(lambda: len(handed) >= 600, 120, "too little was handed out")
            _kill_with_children(releasers["cap-a"].pid)
            killed_at = now_ms()
            # a lease answer lost with the killed releaser runs out (5 s) and is handed out
            # again; a claim it left is taken over after the grace (10 s)
            _wait(settled, 240, "not every message was delivered or deferred")
        finally:
            stop.set()
            for c in consumers:
                c.join(15)
    final = rows()
    received = [h[0] for h in handed]
    assert len(received) == len(set(received)), "a message was handed out twice"
    assert all(deliver_at <= at for _, deliver_at, at in handed), "early"
    per = Counter(i.split("-")[0] for i in received)
    assert len(per) == recipients and set(per.values()) == {2}, per.most_common(3)
    assert {i for i, r in final.items() if r.state == "delivered"} == set(received)
    midnights = {z: next_midnight(ZoneInfo(z), started) for z in zones}
    for z, midnight in midnights.items():  # the test stayed in one local day of each zone
        assert next_midnight(ZoneInfo(z), now_ms()) == midnight
    for i, r in final.items():
        if i not in received:
            midnight = midnights[zone_of[i.split("-")[0]]]
            assert (r.state, r.due_at_ms, r.deliver_at_ms, r.attempts) == (
                "scheduled", midnight, midnight, 0), r
            assert r.requested_at_ms is not None and r.requested_at_ms < midnight
    print(f"settled {(now_ms() - killed_at) / 1000:.1f} s after the kill")
