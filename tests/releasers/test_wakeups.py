"""Wake-ups: writes a releaser must act on soon wake it by datagram (app.delivery.wakeups), its
steps run at a busy pace when woken and an idle pace otherwise (workers/paced.py), and a lost
wake-up costs a delay, never a message."""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from flask.testing import FlaskClient

from app.config import Config
from app.core.timeparse import parse_instant
from app.delivery import wakeups
from app.ops import metrics
from app.services import Services
from app.store.ownership import OwnershipStore
from tests.conftest import own_keyspace
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving
from tests.releasing import releaser, webhook_topic
from tests.waiting import wait_until
from workers import releaser as releaser_module
from workers.paced import PacedStep
from workers.releaser import WARM_MS
from workers.wake_listener import WakeListener

# an idle period no machine's delivery comes near (ms)
IDLE_MS = 20_000


@pytest.fixture(scope="module")
def config() -> Iterator[Config]:
    """A keyspace of this module's own. The shared one holds what every earlier test left
    (hundreds of topics, backlogs, webhook retries to receivers long gone), and a releaser
    started there first works through all of it: these tests time a releaser's wake-ups,
    not its first pass over a crowd (docs/design.md, Known limits)."""
    with own_keyspace("wakeups") as cfg:
        yield cfg


@pytest.fixture(scope="module")
def services(config: Config) -> Iterator[Services]:
    svc = Services(config)
    yield svc
    svc.close()


@contextmanager
def paced(step: Callable[[], bool | None], busy_ms: int, idle_ticks: int,
          warm_ms: int = 0) -> Iterator[PacedStep]:
    """A paced step (its idle runs and wake-ups: tests/test_paced.py) no tick reaches."""
    s = PacedStep("test", step, busy_ms, idle_ticks, lambda f: f(), warm_ms)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_a_wake_during_a_run_makes_one_more_run_after_it() -> None:
    running, finish = threading.Event(), threading.Event()
    runs: list[float] = []

    def step() -> None:
        runs.append(time.monotonic())
        if len(runs) == 2:  # the woken run: it may have read before the write
            running.set()
            finish.wait(5)

    with paced(step, 20, 1) as s:
        assert wait_until(lambda: len(runs) == 1, 2)
        s.wake()
        assert running.wait(2)
        s.wake()  # arrives while the run is under way
        finish.set()
        assert wait_until(lambda: len(runs) == 3, 1)


def test_a_busy_step_and_a_warm_one_keep_the_busy_pace_without_a_wake() -> None:
    runs: list[float] = []

    def busy_four_times() -> bool:
        runs.append(time.monotonic())
        return len(runs) <= 4

    with paced(busy_four_times, 20, 1):
        assert wait_until(lambda: len(runs) == 5, 2)  # four busy runs, then one more
        time.sleep(0.3)
        assert len(runs) == 5  # then idle
    warm: list[float] = []
    with paced(lambda: warm.append(0) and None, 20, 1, warm_ms=600):
        assert wait_until(lambda: len(warm) >= 10, 1)
        time.sleep(0.6)
        settled = len(warm)
        time.sleep(0.3)
        assert len(warm) == settled  # warm-up over: idle


def test_a_foreign_or_unknown_datagram_wakes_nothing() -> None:
    assert wakeups.decode(b"duetime-wake due,topics,bogus") == {"due", "topics"}
    assert wakeups.decode(b"GET / HTTP/1.1") == set()
    assert wakeups.parse_address("10.0.0.7:4242") == ("10.0.0.7", 4242)
    assert wakeups.parse_address("[::1]:4242") == ("::1", 4242)
    assert wakeups.parse_address("nonsense") is None


def test_many_kinds_go_in_datagrams_that_each_fit_and_decode_back() -> None:
    """A process that wrote pointers of many topics in one moment sends their named kinds
    in as many datagrams as they need, none over DATAGRAM_MAX bytes."""
    uids = [uuid.UUID(int=n) for n in range(100)]
    kinds = {wakeups.due_kind(u) for u in uids} | {"due", "topics"}
    datagrams = wakeups.encode(kinds)
    assert len(datagrams) > 1 and all(len(d) <= wakeups.DATAGRAM_MAX for d in datagrams)
    got = set().union(*(wakeups.decode(d) for d in datagrams))
    assert got == kinds
    assert {wakeups.named_topic(k, wakeups.DUE) for k in got} == {*uids, None}
    assert {wakeups.label_of(k) for k in got} == {"due", "topics"}
    assert wakeups.decode(b"duetime-wake pull:not-a-uuid,due:nor-this,due") == {"due"}
    # an older process's pull kind is dropped: the due kind it sent beside it does its work
    assert wakeups.decode(b"duetime-wake pull:" + str(uids[1]).encode()) == set()
    assert wakeups.encode({"due"}) == [b"duetime-wake due"]


@pytest.fixture
def woken(config: Config, services: Services) -> Iterator[queue.Queue[str]]:
    """A wake listener registered as a releaser of the test ring: the kinds it receives."""
    listener = WakeListener(config.replace(wake_host="127.0.0.1"))
    got: queue.Queue[str] = queue.Queue()
    for kind in wakeups.KINDS:
        listener.on(kind, lambda k=kind: got.put(k))  # type: ignore[misc]
    listener.on_named(wakeups.DUE, lambda _uid: got.put("due"))
    listener.start()
    members = OwnershipStore(services.db, config.release_ring)
    members.heartbeat("wake-test", now_ms(), 30, listener.address)
    time.sleep(wakeups.ADDRESSES_EVERY_MS / 1000 + 0.2)  # every sender has read it
    try:
        yield got
    finally:
        members.leave("wake-test")
        listener.close()


def counted(way: str, kind: str) -> float:
    """This process's duetime_wakeups_{way}_total{kind}."""
    counter = metrics.WAKEUPS_SENT if way == "sent" else metrics.WAKEUPS_RECEIVED
    return float(counter.labels(kind)._value.get())


def kinds_within(got: queue.Queue[str], seconds: float) -> set[str]:
    kinds: set[str] = set()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            kinds.add(got.get(timeout=left))
        except queue.Empty:
            break
    return kinds


def test_writes_a_releaser_must_see_soon_wake_it_and_others_do_not(
        woken: queue.Queue[str], client: FlaskClient, auth: dict[str, str]) -> None:
    with receiving(Receiver()) as target:
        pushed, _ = webhook_topic(client, auth, target.url)
        assert kinds_within(woken, 1) == {"topics"}
        sent, received = counted("sent", "due"), counted("received", "due")
        assert pushed.enqueue(id="soon", delay_ms=1000).status_code == 201
        assert kinds_within(woken, 1) == {"due"}
        assert counted("sent", "due") > sent and counted("received", "due") > received
        # due beyond the look-ahead: the walk's idle reads find it in time
        assert pushed.enqueue(id="later", delay_ms=60_000).status_code == 201
        pulled = TopicClient(client, auth)
        assert kinds_within(woken, 1) == {"topics"}
        sent, received = counted("sent", "due"), counted("received", "due")
        # one kind: the walk reads it, and the long polls parked on the topic look again
        assert pulled.enqueue(id="pull-soon").status_code == 201
        assert kinds_within(woken, 1) == {"due"}
        assert counted("sent", "due") > sent and counted("received", "due") > received
        assert pulled.client.put(pulled.url("/schedules/hourly"), headers=auth, json={
            "cron": "0 * * * *", "payload": {}}).status_code == 201
        assert kinds_within(woken, 1) == {"schedules"}
        assert pulled.enqueue(id="c1", campaign="spring", delay_ms=60_000).status_code == 201
        assert client.delete(pulled.url("/campaigns/spring"), headers=auth).status_code == 202
        assert "operations" in kinds_within(woken, 1)


def test_an_idle_releaser_reads_seldom_and_a_new_topic_is_still_on_time(
        config: Config, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # idle periods far longer than any machine's delivery: only the wake-ups explain a
    # message on time (how soon is make bench's figure)
    monkeypatch.setattr(releaser_module, "IDLE_EVERY_MS", IDLE_MS)
    with receiving(Receiver()) as target, \
            releaser(config, "r-idle", release_idle_ms=IDLE_MS) as r:
        time.sleep(WARM_MS / 1000 + 0.5)
        looked = r._walking.runs - r._walking.woken_runs
        time.sleep(2)
        # not every 50 ms: once per idle period at most. Runs a wake-up prompted do not
        # count: in a shared keyspace, schedules and retries of other tests' topics wake it.
        assert r._walking.runs - r._walking.woken_runs - looked <= 1
        heard: list[tuple[str, int]] = []
        def hearing(kind: str) -> Callable[[], None]:
            return lambda: heard.append((kind, now_ms()))

        r.wakes.on("topics", hearing("topics"))
        r.wakes.on_named(wakeups.DUE, lambda _uid: hearing("due")())
        created_at = now_ms()
        topic, _ = webhook_topic(client, auth, target.url)  # "topics", then "due"
        assert topic.enqueue(id="first", delay_ms=200).status_code == 201
        assert target.wait_for(lambda got: len(got) >= 1, 10)
        state = (f"owned {sorted(r.ownership.owned())}; wakes heard (ms after the topic was "
                 f"created) {[(k, t - created_at) for k, t in heard]}; runs (woken) "
                 f"{[(s.name, s.runs, s.woken_runs) for s in r.paced]}")
    first = target.arrivals[0]
    lag = first.received_ms - parse_instant(first.headers["Duetime-Deliver-At"])
    # not the idle periods (20 s to learn the topic, 20 s to look)
    assert 0 <= lag < IDLE_MS / 4, f"lag {lag} ms; {state}"


def test_a_lost_wake_costs_a_delay_never_the_message(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with receiving(Receiver()) as target, releaser(config, "r-deaf") as r:
        topic, _ = webhook_topic(client, auth, target.url)
        assert wait_until(lambda: any(t.name == topic.name for t in r._topics.values()), 10)
        time.sleep(WARM_MS / 1000)
        monkeypatch.setattr(services.waker, "_send", lambda kinds: None)  # every wake lost
        sent = now_ms()
        assert topic.enqueue(id="unannounced", delay_ms=300).status_code == 201
        assert target.wait_for(lambda got: len(got) >= 1, 20)
    arrival = target.arrivals[0]
    assert arrival.message_id == "unannounced"
    assert arrival.received_ms >= parse_instant(arrival.headers["Duetime-Deliver-At"]) >= sent


def test_a_slot_claimed_after_the_warm_up_is_worked_at_once(
        config: Config, services: Services, client: FlaskClient, auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Failover: a releaser claims a slot when a dead owner's lease runs out, long after its
    warm-up; the claim wakes its steps, so the message waiting there is not left to the idle
    periods (20 s here for the walk and the other steps)."""
    monkeypatch.setattr(releaser_module, "IDLE_EVERY_MS", IDLE_MS)
    ring = 7000 + os.getpid() % 1000
    store = OwnershipStore(services.db, ring)
    now = now_ms()
    free_at = now + WARM_MS + 3000  # a dead releaser holds every slot until then
    rows = store.slots(config.release_slots)
    for slot in range(config.release_slots):
        assert store.claim(rows.get(slot), slot, "dead", now, free_at) is not None
    claimed: list[int] = []  # when r-heir claimed slots (ms)
    with receiving(Receiver()) as target, releaser(config, "r-heir", release_ring=ring,
                                                   release_idle_ms=IDLE_MS) as r:
        wake_steps = r.ownership.on_gained

        def claim_noted() -> None:
            claimed.append(now_ms())
            wake_steps()

        r.ownership.on_gained = claim_noted  # nothing is claimable before free_at
        topic, _ = webhook_topic(client, auth, target.url)
        assert topic.enqueue(id="orphan", delay_ms=200).status_code == 201
        assert target.wait_for(lambda got: len(got) >= 1, 20)
    arrival = target.arrivals[0]
    assert arrival.message_id == "orphan"
    assert len(claimed) == 1  # the dead one's leases ran out together: one claim of them all
    assert claimed[0] >= free_at  # nobody acted on a slot the dead one still held
    # the claim woke the steps: the message went at once, not at the next idle run (20 s);
    # when the slot was claimed depends on the renewal tick and the load
    assert arrival.received_ms - claimed[-1] < IDLE_MS / 4, (claimed, arrival.received_ms)
