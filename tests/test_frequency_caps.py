"""Frequency caps on the node (issue 85): exactly `max` handed out per recipient per local
day, checked from the lease answers; the rest deferred to the next local day inside the send
window, or dropped with their reason; a nack gives the slot back, an expired lease does not;
exempt and recipient-less messages are not counted; a claim whose take never ran (a crash)
is taken over; a cancel before the hand-out wins. Days other than today are reached by
calling the take with the time it would run at (the take takes `now`)."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import time
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from flask.testing import FlaskClient

from app.core.frequency_cap import FrequencyCap, next_midnight
from app.core.send_window import SendWindow
from app.core.timeparse import format_ms, parse_instant
from app.delivery import frequency_caps, leasing
from app.delivery.scan import Due
from app.models import MessageState, Pointer, Topic
from app.services import Services
from app.store.frequency_caps import Claim
from tests.consumers import TopicClient
from tests.receiver import Receiver, receiving
from tests.releasing import webhook_topic
from tests.waiting import wait_until

# zones spread around the clock: a test takes three whose wall clock is inside WINDOW now
CANDIDATE_ZONES = ("America/New_York", "Europe/Berlin", "Asia/Kolkata", "Asia/Tokyo",
                   "America/Los_Angeles", "Australia/Sydney", "Pacific/Honolulu",
                   "America/Sao_Paulo", "Asia/Dubai", "Pacific/Auckland", "UTC",
                   "America/Anchorage")
DAY_CAP = {"max": 2, "per": "day", "on_cap": "defer"}
WINDOW = {"days": ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"],
          "start": "06:00", "end": "22:00"}


def _topic(services: Services, auth: dict[str, str], t: TopicClient) -> Topic:
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    found = services.topics.get(tenant or "", t.name)
    assert found is not None
    return found


def _open_zones(n: int) -> list[str]:
    """n zones whose wall clock is well inside WINDOW (06:00-22:00) now."""
    now = dt.datetime.now(dt.UTC)
    found = [z for z in CANDIDATE_ZONES
             if dt.time(6, 30) <= now.astimezone(ZoneInfo(z)).time() <= dt.time(21, 0)]
    assert len(found) >= n
    return found[:n]


def _rows(services: Services, topic: Topic, ids: list[str]) -> dict[str, MessageState]:
    return services.messages.get_many(topic.uid, ids)


def _due(rows: list[MessageState]) -> list[Due]:
    return [Due(Pointer(r.due_at_ms, r.id, r.version, r.priority, r.shard), r) for r in rows]


def _take(services: Services, topic: Topic, rows: list[MessageState], now: int
          ) -> list[MessageState]:
    return leasing.take(services, topic, _due(rows), now, [leasing.Hold(30, "c")] * len(rows))


def test_two_a_local_day_of_five_in_three_zones_rest_deferred_into_the_window(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """200 recipients x 5 messages due now, a cap of 2 a day: the lease answers hand out
    exactly 2 per recipient, none early; the other 3 each wait at the recipient's next local
    midnight, moved into the send window (06:00), their time asked kept; /stats counts 600
    deferrals."""
    t = TopicClient(client, auth, frequency_cap=DAY_CAP, send_window=WINDOW)
    zones = _open_zones(3)
    messages = [{"id": f"r{r}-{k}", "recipient": f"r{r}", "timezone": zones[r % 3]}
                for r in range(200) for k in range(5)]
    t.batch(messages)
    handed = t.drain(400, within_s=30)
    assert t.lease(100, wait_ms=1500) == []
    per = collections.Counter(m["recipient"] for m in t.received)
    assert len(handed) == 400 and set(per.values()) == {2} and len(per) == 200
    assert len(t.received) == 400  # each once
    topic = _topic(services, auth, t)
    rest = _rows(services, topic, [m["id"] for m in messages if m["id"] not in handed])
    assert len(rest) == 600
    window = SendWindow.parse(WINDOW["days"], WINDOW["start"], WINDOW["end"])
    for row in rest.values():
        tz = ZoneInfo(row.timezone or "UTC")
        expected = window.place(next_midnight(tz, row.updated_at_ms), tz)
        assert (row.state, row.deliver_at_ms, row.due_at_ms) == ("scheduled", expected,
                                                                 expected), row
        assert row.requested_at_ms is not None and row.requested_at_ms <= row.created_at_ms
        assert row.attempts == 0
    shown = t.get(rest[next(iter(rest))].id).get_json()
    assert shown["requested_deliver_at"] < shown["deliver_at"]
    wait_until(lambda: client.get(t.url("/stats"), headers=auth).get_json()[
        "frequency_capped"] == {"deferred": 600, "dropped": 0}, 5)


def test_drop_cancels_with_its_reason_and_exempt_or_anonymous_messages_pass(
        client: FlaskClient, auth: dict[str, str]) -> None:
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "hours", "hours": 2,
                                                 "on_cap": "drop"})
    t.batch([{"id": f"d{r}-{k}", "recipient": f"d{r}", "campaign": "spring"}
             for r in range(50) for k in range(3)]
            + [{"id": f"x{k}", "recipient": "d0", "frequency_cap": False} for k in range(3)]
            + [{"id": f"anon{k}"} for k in range(3)])
    handed = t.drain(56, within_s=20)
    assert t.lease(100, wait_ms=1000) == []
    assert {f"x{k}" for k in range(3)} | {f"anon{k}" for k in range(3)} <= handed
    per = collections.Counter(m["recipient"] for m in t.received if m["id"][0] == "d")
    assert set(per.values()) == {1} and len(per) == 50
    dropped = [f"d{r}-{k}" for r in range(50) for k in range(3) if f"d{r}-{k}" not in handed]
    assert len(dropped) == 100
    for message_id in dropped[:20]:
        shown = t.get(message_id).get_json()
        assert (shown["state"], shown["cancel_reason"]) == ("cancelled", "frequency_capped")
    assert t.get("x0").get_json()["frequency_cap_exempt"] is True
    wait_until(lambda: client.get(t.url("/stats"), headers=auth).get_json()[
        "frequency_capped"] == {"deferred": 0, "dropped": 100}, 5)
    view = client.get(t.url("/campaigns/spring"), headers=auth).get_json()
    wait_until(lambda: client.get(t.url("/campaigns/spring"), headers=auth).get_json()[
        "frequency_capped"]["dropped"] == 100, 5)
    assert view["counts"]["cancelled"] == 100


@pytest.mark.parametrize(("zone", "evening", "midnight", "next_one"), [
    # the night before Berlin's spring-forward day; that day is 23 hours long
    ("Europe/Berlin", "2027-03-27T21:00:00+01:00", "2027-03-28T00:00:00+01:00",
     "2027-03-29T00:00:00+02:00"),
    # New York's fall-back day is 25 hours long
    ("America/New_York", "2027-11-06T21:00:00-04:00", "2027-11-07T00:00:00-04:00",
     "2027-11-08T00:00:00-05:00"),
])
def test_days_across_a_dst_change_nack_frees_a_slot_an_expired_lease_does_not(
        client: FlaskClient, auth: dict[str, str], services: Services, zone: str,
        evening: str, midnight: str, next_one: str) -> None:
    t = TopicClient(client, auth, frequency_cap=DAY_CAP, timezone=zone)
    t.batch([{"id": f"m{k}", "recipient": "ann"} for k in range(6)])
    topic = _topic(services, auth, t)
    ids = [f"m{k}" for k in range(6)]
    day1 = parse_instant(evening)
    first = _take(services, topic, list(_rows(services, topic, ids).values()), day1)
    assert len(first) == 2
    rows = _rows(services, topic, ids)
    deferred = [r for r in rows.values() if r.state == "scheduled"]
    assert len(deferred) == 4
    assert {r.due_at_ms for r in deferred} == {parse_instant(midnight)}
    # a nack gives its slot back: the nacked message, due again at once, is taken again
    # on day 1 on a slot of its own
    leasing.nack(services, topic, first[0].id, leasing.token_of(first[0]), 0, None)
    nacked = _rows(services, topic, [first[0].id])[first[0].id]
    assert [r.id for r in _take(services, topic, [nacked], day1 + 1000)] == [first[0].id]
    # the other lease runs out and its message is taken again: it keeps its slot, so a
    # message due later on day 1 is still past the cap
    assert t.enqueue(id="m6", recipient="ann").status_code == 201
    late = day1 + 31_000
    expired = _rows(services, topic, [first[1].id])[first[1].id]
    assert [r.id for r in _take(services, topic, [expired], late)] == [first[1].id]
    assert _take(services, topic, [_rows(services, topic, ["m6"])["m6"]], late) == []
    # the next local day: two more, the rest to the midnight after, across the DST change
    ids.append("m6")
    day2 = parse_instant(midnight)
    waiting = [r for r in _rows(services, topic, ids).values() if r.state == "scheduled"]
    assert len(waiting) == 5 and {r.due_at_ms for r in waiting} == {day2}
    assert len(_take(services, topic, waiting, day2)) == 2
    left = [r for r in _rows(services, topic, ids).values() if r.state == "scheduled"]
    assert len(left) == 3 and {r.due_at_ms for r in left} == {parse_instant(next_one)}
    day3 = parse_instant(next_one)
    assert len(_take(services, topic, left, day3)) == 2


def test_a_claim_whose_take_never_ran_is_taken_over_after_its_grace(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """A releaser killed between a claim and its take: the slot's holder is still as at its
    claim. Within the grace another message is only moved a moment; after it, the holder
    is fenced (its version moves, so that take can never apply) and the slot reused."""
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "drop"})
    t.batch([{"id": "ghost", "recipient": "bo"}, {"id": "real", "recipient": "bo"}])
    topic = _topic(services, auth, t)
    rows = _rows(services, topic, ["ghost", "real"])
    now = services.clock()
    ghost = rows["ghost"]
    cap = FrequencyCap(1, None, "drop")
    assert services.caps.claim(topic.uid, "bo", 0, Claim(
        "ghost", cap.window_end(ZoneInfo("UTC"), now), now, ghost.version, ghost.attempts),
        None)
    assert _take(services, topic, [rows["real"]], now + 100) == []
    moved = _rows(services, topic, ["real"])["real"]
    assert moved.state == "scheduled" and moved.due_at_ms >= now + 1000  # not dropped
    later = now + frequency_caps.CLAIM_GRACE_MS + 1
    assert [r.id for r in _take(services, topic, [moved], later)] == ["real"]
    fenced = _rows(services, topic, ["ghost"])["ghost"]
    assert fenced.version == ghost.version + 1 and fenced.state == "scheduled"
    assert _take(services, topic, [ghost], later) == []  # the old take can never apply


def test_a_cancel_before_the_hand_out_wins_and_frees_the_slot(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "defer"})
    t.batch([{"id": "c1", "recipient": "cy"}, {"id": "c2", "recipient": "cy"}])
    topic = _topic(services, auth, t)
    rows = _rows(services, topic, ["c1", "c2"])
    assert client.delete(t.url("/messages/c1"), headers=auth).status_code == 204
    now = services.clock()
    assert _take(services, topic, [rows["c1"]], now) == []  # as read before the cancel
    assert t.get("c1").get_json()["state"] == "cancelled"
    assert [r.id for r in _take(services, topic, [rows["c2"]], now + 10)] == ["c2"]


@pytest.mark.parametrize(("cap", "field"), [
    ({"max": 0, "per": "day", "on_cap": "defer"}, "max"),
    ({"max": 2, "per": "week", "on_cap": "defer"}, "per"),
    ({"max": 2, "per": "hours", "on_cap": "defer"}, "hours"),
    ({"max": 2, "per": "day", "hours": 3, "on_cap": "defer"}, "hours"),
    ({"max": 2, "per": "day", "on_cap": "later"}, "on_cap"),
    ({"max": 2, "per": "day"}, "on_cap"),
    ("2/day", "frequency_cap"),
])
def test_a_bad_cap_is_a_400_naming_its_field(client: FlaskClient, auth: dict[str, str],
                                             cap: Any, field: str) -> None:
    answer = client.put("/v1/topics/badcap", json={"frequency_cap": cap}, headers=auth)
    assert answer.status_code == 400 and answer.content_type == "application/problem+json"
    assert field in str(answer.get_json()), answer.get_json()


def test_a_cap_is_shown_changed_and_removed_and_a_bad_exemption_is_a_400(
        client: FlaskClient, auth: dict[str, str]) -> None:
    t = TopicClient(client, auth, frequency_cap={"max": 3, "per": "hours", "hours": 6,
                                                 "on_cap": "drop"})
    shown = client.get(t.url(), headers=auth).get_json()["frequency_cap"]
    assert shown == {"max": 3, "per": "hours", "hours": 6, "on_cap": "drop"}
    client.put(t.url(), json={"frequency_cap": DAY_CAP}, headers=auth)
    assert client.get(t.url(), headers=auth).get_json()["frequency_cap"] == DAY_CAP
    client.put(t.url(), json={"frequency_cap": None}, headers=auth)
    assert client.get(t.url(), headers=auth).get_json()["frequency_cap"] is None
    answer = t.enqueue(recipient="z", frequency_cap="no")
    assert answer.status_code == 400 and "frequency_cap" in str(answer.get_json())


def test_an_uncapped_topic_reads_and_writes_no_slot(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    t = TopicClient(client, auth)
    t.batch([{"id": "u1", "recipient": "un"}])
    topic = _topic(services, auth, t)
    row = _rows(services, topic, ["u1"])["u1"]
    admitted = frequency_caps.admit(services, topic, [row], services.clock())
    assert admitted == frequency_caps.Admission()
    capped = dataclasses.replace(topic, settings=dataclasses.replace(
        topic.settings, frequency_cap="1/day/defer"))
    exempt = dataclasses.replace(row, cap_exempt=True)
    assert frequency_caps.admit(services, capped, [exempt], services.clock()).claimed == {}
    assert services.caps.read_many(topic.uid, ["un"]) == {"un": {}}


def test_a_failed_post_gives_its_slot_back_so_another_message_of_its_recipient_goes(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """A capped webhook topic (2 a day), 20 recipients x 4 messages: a due now, b, c, d one
    after another later. The receiver answers 500 to every a (max_attempts 1: it is dead),
    which gives its slot back, so b and c are POSTed and answered 2xx; d finds both slots
    used and waits at the next local midnight. Had a's slot been kept, c would wait too."""
    zone = _open_zones(1)[0]
    with receiving(Receiver(lambda message_id, before: 500 if message_id.endswith("-a")
                            else 200)) as target:
        t, _ = webhook_topic(client, auth, target.url, max_attempts=1, timezone=zone,
                             frequency_cap=DAY_CAP)
        start = services.clock() + 500
        t.batch([{"id": f"p{r}-{k}", "recipient": f"p{r}",
                  "deliver_at": format_ms(start + offset)}
                 for r in range(20) for k, offset in (("a", 0), ("b", 3000), ("c", 4000),
                                                      ("d", 5000))])
        topic = _topic(services, auth, t)
        ids = [f"p{r}-{k}" for r in range(20) for k in "abcd"]
        midnight = next_midnight(ZoneInfo(zone), start)

        def settled() -> bool:
            states = collections.Counter(
                r.state if r.state != "scheduled" or r.due_at_ms == midnight else "due"
                for r in _rows(services, topic, ids).values())
            return (states["dead"], states["delivered"], states["scheduled"]) == (20, 40, 20)

        assert wait_until(settled, 30), collections.Counter(
            r.state for r in _rows(services, topic, ids).values())
        time.sleep(0.5)
        arrivals = target.ids()
    assert sorted(arrivals) == sorted(i for i in ids if not i.endswith("-d"))  # each once
    rows = _rows(services, topic, ids)
    for r in range(20):
        assert rows[f"p{r}-a"].state == "dead"
        assert {rows[f"p{r}-{k}"].state for k in "bc"} == {"delivered"}
        d = rows[f"p{r}-d"]
        assert (d.state, d.due_at_ms, d.attempts) == ("scheduled", midnight, 0), d


def test_a_nack_over_http_frees_the_slot_for_the_recipient_s_next_message(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """A cap of 1 a day, two recipients with two messages each, the second due 2 s after
    the first. Each first message is leased through a consumer's call; one is nacked (due
    again in 10 minutes), the other acked. The nacked recipient's second message is handed
    out when due; the acked one's waits at the next local midnight."""
    zone = _open_zones(1)[0]
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "defer"},
                    timezone=zone)
    later = format_ms(t.clock() + 2000)
    t.batch([{"id": "n1", "recipient": "nan"}, {"id": "n2", "recipient": "nan",
                                                "deliver_at": later},
             {"id": "k1", "recipient": "kim"}, {"id": "k2", "recipient": "kim",
                                                "deliver_at": later}])
    first = {m["id"]: m for m in t.lease(10, wait_ms=1500)}
    while len(first) < 2:
        more = t.lease(10, wait_ms=1500)
        assert more, first
        first.update({m["id"]: m for m in more})
    assert set(first) == {"n1", "k1"}
    nack = client.post(t.url("/messages/n1/nack"), headers=auth, json={
        "lease_token": first["n1"]["lease"]["token"], "delay_ms": 600_000})
    assert nack.status_code == 204, nack.get_json()
    assert t.ack(first["k1"]) == 204
    second = t.drain(1, within_s=10)
    assert second == {"n2"}
    assert t.lease(10, wait_ms=1000) == []
    k2 = t.get("k2").get_json()
    assert k2["state"] == "scheduled"
    assert parse_instant(k2["deliver_at"]) == next_midnight(ZoneInfo(zone), t.clock())


def test_a_deferral_widens_its_campaign_s_bounds_so_a_shift_moves_it(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """A cap of 1 a day: of a recipient's two campaign messages due now one is handed out,
    the other deferred to the next local midnight; the campaign's last_deliver_at becomes
    that midnight, and a campaign shift reaches the deferred message too."""
    zone = _open_zones(1)[0]
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "defer"},
                    timezone=zone)
    now = format_ms(t.clock())
    t.batch([{"id": f"w{k}", "recipient": "wes", "campaign": "fall", "deliver_at": now}
             for k in range(2)])
    view = client.get(t.url("/campaigns/fall"), headers=auth).get_json()
    assert view["last_deliver_at"] == view["first_deliver_at"] == now
    handed = t.drain(1, within_s=10)
    assert t.lease(10, wait_ms=1000) == []
    (left,) = {"w0", "w1"} - handed
    midnight = next_midnight(ZoneInfo(zone), t.clock())
    assert parse_instant(t.get(left).get_json()["deliver_at"]) == midnight
    view = client.get(t.url("/campaigns/fall"), headers=auth).get_json()
    assert parse_instant(view["last_deliver_at"]) == midnight, view
    assert parse_instant(view["first_deliver_at"]) < midnight
    asked = parse_instant(t.get(left).get_json()["requested_deliver_at"])
    shift = client.patch(t.url("/campaigns/fall"), headers=auth,
                         json={"shift_ms": 3_600_000})
    assert shift.status_code == 202, shift.get_json()
    # the shift moves the time it asked for (as for a send window's move); the cap is
    # applied again when it comes due
    assert wait_until(lambda: parse_instant(t.get(left).get_json()["deliver_at"])
                      == asked + 3_600_000, 15), t.get(left).get_json()


def test_after_max_is_lowered_hand_outs_in_slots_past_it_still_count(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """A cap of 3 a day lowered to 2. Recipient lo was handed 3 (slots 0-2), then the first
    was nacked (slot 0 free): its 2 hand-outs left, one in slot 2, fill the new cap, so its
    next message waits at midnight (slot 0 alone would have let it go, a third). Recipient gh
    holds slot 0 (handed out) and slot 2 (a claim whose take never ran): within the claim
    grace its next message is only moved a moment; after it the claim past max is given
    back (its holder fenced) and the message goes in slot 1."""
    zone = _open_zones(1)[0]
    t = TopicClient(client, auth, frequency_cap={"max": 3, "per": "day", "on_cap": "defer"},
                    timezone=zone)
    t.batch([{"id": f"lo{k}", "recipient": "lo"} for k in range(4)]
            + [{"id": f"gh{k}", "recipient": "gh"} for k in range(3)])
    topic = _topic(services, auth, t)
    lowered = dataclasses.replace(topic, settings=dataclasses.replace(
        topic.settings, frequency_cap="2/day/defer"))
    now = services.clock()
    rows = _rows(services, topic, ["lo0", "lo1", "lo2", "lo3", "gh0", "gh1", "gh2"])
    taken = _take(services, topic, [rows[f"lo{k}"] for k in range(3)] + [rows["gh0"]], now)
    assert {r.id for r in taken} == {"lo0", "lo1", "lo2", "gh0"}
    first = next(r for r in taken if r.id == "lo0")
    leasing.nack(services, topic, "lo0", leasing.token_of(first), 600_000, None)
    cap = FrequencyCap(3, None, "defer")
    ghost = rows["gh1"]
    assert services.caps.claim(topic.uid, "gh", 2, Claim(
        "gh1", cap.window_end(ZoneInfo(zone), now), now, ghost.version, ghost.attempts), None)
    assert {s.slot for s in services.caps.read_many(topic.uid, ["gh"])["gh"].values()} == {0, 2}

    assert _take(services, lowered, [rows["lo3"]], now + 100) == []
    midnight = next_midnight(ZoneInfo(zone), now)
    lo3 = _rows(services, topic, ["lo3"])["lo3"]
    assert (lo3.state, lo3.due_at_ms) == ("scheduled", midnight), lo3

    assert _take(services, lowered, [rows["gh2"]], now + 100) == []
    gh2 = _rows(services, topic, ["gh2"])["gh2"]
    assert gh2.state == "scheduled" and now + 1000 <= gh2.due_at_ms < midnight  # a moment
    later = now + frequency_caps.CLAIM_GRACE_MS + 1
    assert [r.id for r in _take(services, lowered, [gh2], later)] == ["gh2"]
    slots = services.caps.read_many(topic.uid, ["gh"])["gh"]
    assert (slots[1].message_id, slots[2].window_end_ms) == ("gh2", 0)
    assert _rows(services, topic, ["gh1"])["gh1"].version == ghost.version + 1  # fenced


def test_a_lease_run_out_taken_again_while_the_slot_is_undecided_is_scheduled_not_stranded(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """A message whose lease ran out, taken again while its recipient's only slot is held
    by another's claim still within its grace: it is moved a moment and scheduled, not left
    `leased` with its pointer spent (nobody would ever take it again)."""
    t = TopicClient(client, auth,
                    frequency_cap={"max": 1, "per": "hours", "hours": 1, "on_cap": "defer"})
    t.batch([{"id": "first", "recipient": "al"}, {"id": "second", "recipient": "al"}])
    topic = _topic(services, auth, t)
    rows = _rows(services, topic, ["first", "second"])
    t0 = services.clock()
    assert [r.id for r in _take(services, topic, [rows["first"]], t0)] == ["first"]
    leased = _rows(services, topic, ["first"])["first"]
    t1 = t0 + 3_600_000 + 1_000  # its lease and its slot's hour are over
    cap = FrequencyCap(1, 1, "defer")
    slot = services.caps.read_many(topic.uid, ["al"])["al"][0]
    assert services.caps.claim(topic.uid, "al", 0, Claim(
        "second", cap.window_end(ZoneInfo("UTC"), t1 - 500), t1 - 500,
        rows["second"].version, rows["second"].attempts), slot)
    assert _take(services, topic, [leased], t1) == []
    again = _rows(services, topic, ["first"])["first"]
    assert again.state == "scheduled" and again.lease_token is None
    assert again.version == leased.version + 1 and again.due_at_ms > t1


def test_a_slot_whose_holder_row_is_gone_or_made_again_still_counts(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """A claim whose message row cannot be read (it expired within a long window) or was
    made again after the claim: nothing says that message was not handed out, so its slot
    counts until its window ends; the next message is deferred, never a max + 1."""
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "drop"})
    t.batch([{"id": "next", "recipient": "cy"}])
    topic = _topic(services, auth, t)
    now = services.clock()
    cap = FrequencyCap(1, None, "drop")
    assert services.caps.claim(topic.uid, "cy", 0, Claim(
        "expired-long-ago", cap.window_end(ZoneInfo("UTC"), now), now - 60_000, 1, 0), None)
    row = _rows(services, topic, ["next"])["next"]
    later = now + frequency_caps.CLAIM_GRACE_MS + 1
    assert _take(services, topic, [row], later) == []
    assert _rows(services, topic, ["next"])["next"].state == "cancelled"  # dropped, not sent


def test_a_claim_left_by_a_take_that_never_applied_is_claimed_over_by_its_own_retake(
        client: FlaskClient, auth: dict[str, str], services: Services) -> None:
    """The message holding a claim whose take never applied is taken again: it claims over
    its own slot with a conditional write (not reusing it unwritten), so a process fencing
    that claim at the same moment and this take meet at the slot; once it is handed out
    the slot records it (attempts moved) and a fence leaves it counted."""
    t = TopicClient(client, auth, frequency_cap={"max": 1, "per": "day", "on_cap": "drop"})
    t.batch([{"id": "mine", "recipient": "di"}])
    topic = _topic(services, auth, t)
    row = _rows(services, topic, ["mine"])["mine"]
    now = services.clock()
    cap = FrequencyCap(1, None, "drop")
    assert services.caps.claim(topic.uid, "di", 0, Claim(
        "mine", cap.window_end(ZoneInfo("UTC"), now), now - 1, row.version, row.attempts),
        None)
    assert [r.id for r in _take(services, topic, [row], now)] == ["mine"]
    [slot] = services.caps.read_many(topic.uid, ["di"])["di"].values()
    assert slot.claimed_at_ms == now and slot.message_id == "mine"  # claimed over, anew
