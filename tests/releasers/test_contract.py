"""The producer's contract under load (openapi.yaml, DELETE of a message; docs/design.md, "How a
due message is found"): a message is leased only once a consumer's call is answered with it
(push: once its POST starts), so until then every cancel and move wins, whatever the topic's
load; among due messages priority comes first, for every hand-out."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask

from app.config import Config
from app.core.timeparse import format_ms, parse_instant
from tests.consumers import TopicClient, now_ms
from tests.receiver import Receiver, receiving
from tests.releasers.test_broker import api, topic_uid, wait_owned
from tests.releasing import releaser, webhook_topic
from workers.releaser import Releaser

SLOTS = 4


@pytest.fixture()
def ring() -> Iterator[dict[str, Any]]:
    """Settings of a ring of release slots of this test's own."""
    yield {"release_ring": 7000 + int(time.time() * 1000) % 1000, "release_slots": SLOTS}


@contextmanager
def _stack(config: Config, auth: dict[str, str], ring: dict[str, Any], member: str
           ) -> Iterator[tuple[Flask, Releaser]]:
    """An app on the test's ring and one releaser owning every slot of it."""
    app = api(config, ring)
    try:
        with releaser(config, member, **ring) as r:
            wait_owned(r)
            yield app, r
    finally:
        app.extensions["duetime"].close()


class _Worker:
    """One consumer taking `max: 1` at a time, `work_s` of work each, then an ack; records
    each hand-out as it is received: (id, when its call started, when it was answered, the
    message), then when its ack was sent and the ack's status."""

    def __init__(self, topic: TopicClient, work_s: float, wait_ms: int = 500) -> None:
        self.topic = topic
        self.work_s = work_s
        self.wait_ms = wait_ms
        self.handed: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Worker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = now_ms()
            for m in self.topic.lease(max_messages=1, wait_ms=self.wait_ms):
                received = {"id": m["id"], "started": started,
                            "answered": m["received_at"], "message": m, "ack": None}
                self.handed.append(received)
                time.sleep(self.work_s)
                received["acking"] = now_ms()
                received["ack"] = self.topic.ack(m)

    def ids(self) -> set[str]:
        return {h["id"] for h in list(self.handed)}


def _wait(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _cancel(topic: TopicClient, message_id: str) -> tuple[int, int]:
    """DELETE the message: (status, when it was answered, epoch ms)."""
    status = topic.client.delete(topic.url(f"/messages/{message_id}"),
                                 headers=topic.headers).status_code
    return status, now_ms()


def test_on_a_busy_topic_every_cancel_and_move_of_a_message_nobody_received_wins(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """120 messages due, one worker taking one at a time (50 ms of work each): cancels of
    the next 40 due that no consumer has received all answer 204, and none of them is handed
    out by a call that started after its cancel was answered (nor ever delivered); moves of
    40 more answer 200 and each is handed out at its new time, never before."""
    with _stack(config, auth, ring, "c-busy") as (app, _r):
        topic = TopicClient(app.test_client(), auth)
        base = now_ms() - 1000
        ids = [f"m{n:03d}" for n in range(120)]
        sent = topic.batch([{"id": i, "deliver_at": format_ms(base + n)}
                            for n, i in enumerate(ids)])
        assert {s["status"] for s in sent} == {201}
        with _Worker(topic, work_s=0.05) as worker:
            _wait(lambda: len(worker.handed) >= 10, 20, "the worker got nothing")
            received = worker.ids()
            moved = [i for i in ids if i not in received][50:90]
            later = now_ms() + 3000
            for i in moved:
                answer = topic.client.patch(topic.url(f"/messages/{i}"), headers=topic.headers,
                                            json={"deliver_at": format_ms(later)})
                assert answer.status_code == 200, (i, answer.get_json())
            received = worker.ids()
            cancelled = [i for i in ids if i not in received and i not in moved][:40]
            answers = {i: _cancel(topic, i) for i in cancelled}
            # The worker may receive one of them as the cancels reach it and ack it before a
            # slow cancel of it answers: such a one, delivered, is refused (each is checked
            # below: acked before its cancel answered, and delivered).
            held = {i for i, (status, _) in answers.items() if status == 409}
            assert {status for i, (status, _) in answers.items() if i not in held} == {204}
            _wait(lambda: worker.ids() | set(cancelled) >= set(ids), 60,
                  "the worker did not get every message left")
            time.sleep(0.5)
        for h in worker.handed:
            if h["id"] in held:  # acked before its cancel was answered
                assert h["acking"] <= answers[h["id"]][1] and h["ack"] == 204, h
            elif h["id"] in answers:  # only by a call already under way when it was cancelled
                assert h["started"] <= answers[h["id"]][1] and h["ack"] == 409, h
            else:
                assert h["ack"] == 204, h
            if h["id"] in moved:
                assert parse_instant(h["message"]["deliver_at"]) == later
                assert h["answered"] >= later, h
        assert worker.ids() | set(cancelled) == set(ids)
        assert held <= worker.ids()
        for i in cancelled:
            assert topic.get(i).get_json()["state"] == ("delivered" if i in held else "cancelled")


# how long before a message's due time its cancel or move is sent (ms)
BEFORE_MS = (20, 50, 100, 250, 500, 1000)


def _act_before_due(topic: TopicClient, first_due: int
                    ) -> tuple[dict[str, int], set[str], dict[str, int], set[str]]:
    """Per gap in BEFORE_MS, three messages due together (300 ms apart from the next gap's):
    one cancelled, one moved 2 s later, one left, each action sent that long before their
    due time. Returns {id: status} of the cancels and moves, the ids left alone, the moved
    ones' new times (epoch ms), and the ids whose action was answered only at or after their
    due time (a host too busy to send it in time: the take may rightly have won those)."""
    plan: list[tuple[int, str, str, int]] = []  # (when to act, what, id, its due time)
    kept: set[str] = set()
    for n, before in enumerate(BEFORE_MS):
        due = first_due + n * 300
        for kind in ("cancel", "move", "keep"):
            message_id = f"{kind}-{before}"
            answer = topic.enqueue(id=message_id, deliver_at=format_ms(due))
            assert answer.status_code == 201, answer.get_json()
            if kind == "keep":
                kept.add(message_id)
            else:
                plan.append((due - before, kind, message_id, due))
    statuses: dict[str, int] = {}
    moved_to: dict[str, int] = {}
    late: set[str] = set()
    for at, kind, message_id, due in sorted(plan):
        time.sleep(max(0.0, (at - now_ms()) / 1000))
        path = topic.url(f"/messages/{message_id}")
        if kind == "cancel":
            statuses[message_id] = topic.client.delete(path, headers=topic.headers).status_code
        else:
            moved_to[message_id] = due + 2000
            statuses[message_id] = topic.client.patch(
                path, headers=topic.headers,
                json={"deliver_at": format_ms(moved_to[message_id])}).status_code
        if now_ms() >= due:
            late.add(message_id)
    assert len(late) <= 3, late  # the test means something only if most came in time
    return statuses, kept, {i: t for i, t in moved_to.items() if i not in late}, late


def test_cancels_and_moves_just_before_the_due_time_win_against_a_long_poll(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A consumer long-polls all along; cancels and moves sent 20 ms to 1 s before their
    messages' due time all win (204, 200): no cancelled message is handed out, and a moved
    one only at its new time."""
    with _stack(config, auth, ring, "c-pull-before") as (app, _r):
        topic = TopicClient(app.test_client(), auth)
        stop = threading.Event()
        got: list[dict[str, Any]] = []

        def poll() -> None:
            while not stop.is_set():
                for m in topic.lease(max_messages=10, wait_ms=1000):
                    got.append(m)
                    assert topic.ack(m) == 204

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            statuses, kept, moved_to, late = _act_before_due(topic, now_ms() + 2000)
            assert {i: s for i, s in statuses.items() if i not in late} == {
                i: (204 if i.startswith("cancel") else 200) for i in statuses if i not in late}
            _wait(lambda: {m["id"] for m in got} >= kept | set(moved_to), 30,
                  "not every message left and moved was handed out")
            time.sleep(0.3)
        finally:
            stop.set()
            poller.join(10)
        handed = [m["id"] for m in got if m["id"] not in late]
        assert sorted(handed) == sorted(kept | set(moved_to))  # none cancelled, each once
        for m in got:  # TopicClient.lease checks received_at >= deliver_at
            if m["id"] in moved_to:
                assert parse_instant(m["deliver_at"]) == moved_to[m["id"]], m


def test_cancels_and_moves_just_before_the_due_time_win_on_a_webhook_topic(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """On a webhook topic, cancels and moves sent 20 ms to 1 s before the due time all win:
    a message is taken for its POST only at its due time, so none cancelled is POSTed, and a
    moved one only at its new time."""
    with receiving(Receiver()) as target, _stack(config, auth, ring, "c-push-before") as (app, _r):
        topic, _secret = webhook_topic(app.test_client(), auth, target.url)
        statuses, kept, moved_to, late = _act_before_due(topic, now_ms() + 2000)
        assert {i: s for i, s in statuses.items() if i not in late} == {
            i: (204 if i.startswith("cancel") else 200) for i in statuses if i not in late}
        assert target.wait_for(lambda arrivals: {a.message_id for a in arrivals}
                               >= kept | set(moved_to), 30)
        time.sleep(0.3)
        ids = [i for i in target.ids() if i not in late]
        assert sorted(ids) == sorted(kept | set(moved_to))  # none cancelled, each once
        for a in target.arrivals:
            deliver_at = parse_instant(a.headers["Duetime-Deliver-At"])
            assert a.received_ms >= deliver_at, a
            assert deliver_at == moved_to.get(a.message_id, deliver_at)


def test_no_lower_priority_message_is_handed_out_while_a_higher_one_waits(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A slow pool (one worker, one at a time) draining 150 priority-200 messages; 20
    priority-0 messages come due 3 s after the start: from the recorded history, no
    priority-200 message is handed out once a priority-0 one had been due for 100 ms and was
    not handed out yet."""
    with _stack(config, auth, ring, "c-order") as (app, _r):
        topic = TopicClient(app.test_client(), auth)
        start = now_ms()
        topic.batch([{"id": f"low{n:03d}", "priority": 200, "deliver_at": format_ms(start)}
                     for n in range(150)])
        urgent_due = start + 3000
        topic.batch([{"id": f"urgent{n:02d}", "priority": 0, "deliver_at": format_ms(urgent_due)}
                     for n in range(20)])
        with _Worker(topic, work_s=0.05) as worker:
            _wait(lambda: len(worker.handed) >= 170, 60, "the pool did not drain the topic")
        handed = {h["id"]: h["answered"] for h in worker.handed}
        last_urgent = max(at for i, at in handed.items() if i.startswith("urgent"))
        late = [(i, at) for i, at in handed.items()
                if i.startswith("low") and urgent_due + 100 <= at and at < last_urgent]
        # a call already under way when the urgent ones came due may still get a low one
        assert len(late) <= 1, late
        assert all(h["ack"] == 204 for h in worker.handed)


def test_after_a_campaign_is_shifted_and_cancelled_plain_messages_reach_one_message_polls(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A 200-message campaign shifted to now, then a year away, then cancelled: a plain
    message due on the topic afterwards is handed to the next `max: 1` long poll, and none
    of the campaign's messages goes out after its cancel."""
    from tests.campaign_helpers import running_operations, wait_operation

    with _stack(config, auth, ring, "c-campaign") as (app, r):
        topic = TopicClient(app.test_client(), auth)
        due = now_ms() + 10_000
        topic.batch([{"campaign": "blast", "deliver_at": format_ms(due)} for _ in range(200)])
        with running_operations(r.services, "c-campaign-ops"):
            for change in ({"shift_ms": -(due - now_ms())}, {"shift_ms": 365 * 86_400_000}):
                answer = topic.client.patch(topic.url("/campaigns/blast"),
                                            headers=topic.headers, json=change)
                assert answer.status_code == 202, answer.get_json()
                wait_operation(topic, answer.get_json()["operation"]["id"], 60)
            answer = topic.client.delete(topic.url("/campaigns/blast"), headers=topic.headers)
            assert answer.status_code == 202, answer.get_json()
            done = wait_operation(topic, answer.get_json()["operation"]["id"], 60)
        assert done["state"] == "succeeded"
        assert topic.enqueue(id="plain").status_code == 201
        [got] = topic.lease(max_messages=1, wait_ms=3000)
        assert got["id"] == "plain" and got["attempt"] == 1
        assert topic.ack(got) == 204
        assert topic.lease(max_messages=10, wait_ms=300) == []


def test_a_stalled_api_process_holds_no_other_process_s_calls(
        config: Config, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """An API process that stops reading (SIGSTOPped, or cut off) while its wants are
    answered with large messages: every broker thread sending to it gives up within the
    send timeout, so another process's long poll on another topic is answered at once, and
    the stalled process's messages go back for others."""
    import socket

    from app.delivery import broker_wire

    with _stack(config, auth, ring, "c-stalled") as (app, r):
        stalled_topics = [TopicClient(app.test_client(), auth) for _ in range(6)]
        body = {"blob": "x" * 60_000}
        for t in stalled_topics:
            t.batch([{"payload": body} for _ in range(4)])
        port = int(r.wakes.address.rpartition(":")[2])
        # small buffers at both ends (accepted sockets inherit the listener's): a stopped
        # process's fill after a few answers, not after megabytes
        assert r.broker._server is not None
        r.broker._server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        try:
            wants = [broker_wire.Want(n, topic_uid(app, auth, t), 4, 30, None, 20_000)
                     for n, t in enumerate(stalled_topics)]
            stalled.sendall(broker_wire.encode_hello(r.broker.token)
                            + b"".join(broker_wire.encode_want(w) for w in wants))
            time.sleep(0.5)  # the answers are sent and fill the stalled end's buffers
            other = TopicClient(app.test_client(), auth)
            assert other.enqueue(id="mine").status_code == 201
            # within a second: rounds hand their answers to the connections' outboxes and go
            # on (the old code held every broker thread in the stalled sends, and this call
            # got nothing within its 5 s wait; then 1.6-2.6 s, a send timeout per thread)
            started = time.monotonic()
            [got] = other.lease(max_messages=1, wait_ms=5000)
            assert got["id"] == "mine" and time.monotonic() - started < 1.0
        finally:
            stalled.close()
        # what could not be sent went back, its attempt not counted (what the stalled end's
        # buffers took is in flight to it, as an answer to a consumer that went away)
        again = [m for t in stalled_topics for m in t.lease(max_messages=4, wait_ms=1000)]
        assert len(again) >= 4 and {m["attempt"] for m in again} == {1}


STOP_PORT = 18098


def test_a_sigstopped_api_process_delays_no_other_process_s_call(
        config: Config, services: Any, auth: dict[str, str], ring: dict[str, Any]) -> None:
    """A gunicorn API process is stopped (SIGSTOP) while its long polls on six topics wait,
    and 18 MB of due messages are taken for them: more than its sockets' buffers hold, so
    the releaser's sends to it stall, on more topics than the broker has round threads.
    Another API process's long poll gets its message within a second of its due time
    meanwhile; once the stopped process goes on, it answers again."""
    import os
    import signal

    from tests.faults.stack import children

    tenant = f"stop{now_ms()}"
    http = _Http(f"http://127.0.0.1:{STOP_PORT}", services.keys.create(tenant))
    big = {"blob": "x" * 60_000}
    with _served_stack(config, ring, ["c-stop"], port=STOP_PORT, workers=1) as (api_process, _):
        names = [f"stopped{n}" for n in range(6)]
        for name in names:
            assert http.call("PUT", f"/v1/topics/{name}", {}).status == 201
        waiting = [threading.Thread(target=http.call, daemon=True, args=(
            "POST", f"/v1/topics/{name}/leases", {"max": 25, "wait_ms": 8000}))
            for name in names for _ in range(2)]
        for w in waiting:
            w.start()
        time.sleep(1.0)  # the waits are parked at the releaser
        [worker] = children(api_process.pid)
        app = api(config, ring)
        try:
            os.kill(worker, signal.SIGSTOP)
            key = {"Authorization": http.headers["Authorization"]}
            for name in names:
                stopped = TopicClient(app.test_client(), key, name=name)
                for _ in range(2):
                    assert len(stopped.batch([{"payload": big} for _ in range(25)])) == 25
            other = TopicClient(app.test_client(), auth)
            due = now_ms() + 1500
            assert other.enqueue(id="mine", deliver_at=format_ms(due)).status_code == 201
            [got] = other.lease(max_messages=1, wait_ms=5000)
            assert got["id"] == "mine" and got["received_at"] - due < 1000, got
        finally:
            os.kill(worker, signal.SIGCONT)
            app.extensions["duetime"].close()
        assert http.call("GET", "/healthz").status == 200
        for w in waiting:
            w.join(15)


def test_sends_that_make_no_progress_fail_within_the_timeout() -> None:
    """broker_wire.bound_sends: a blocking send to a peer that reads nothing fails
    (OSError) once its buffers are full, after SEND_TIMEOUT_S, not never."""
    import socket

    from app.delivery import broker_wire

    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    try:
        broker_wire.bound_sends(near, 0.3)
        began = time.monotonic()
        with pytest.raises(OSError):
            for _ in range(10_000):
                near.sendall(b"x" * 65536)
        assert time.monotonic() - began < 5
    finally:
        near.close()
        far.close()


def test_a_2xx_post_whose_outcome_cannot_be_written_is_kept_not_posted_again(
        config: Config, auth: dict[str, str], ring: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A POST answered 200 whose outcome write fails (no node) for longer than its lease:
    the outcome is kept and written once the store answers again. The message is POSTed
    once, ends delivered, never dead (its one attempt), and a cancel meanwhile answers 409."""
    from app.errors import StoreUnavailable
    from workers import push as push_module

    record = push_module.record_outcomes
    failing = threading.Event()
    failing.set()

    def refused(*args: Any, **kwargs: Any) -> Any:
        if failing.is_set():
            raise StoreUnavailable("no node answered")
        return record(*args, **kwargs)

    monkeypatch.setattr(push_module, "record_outcomes", refused)
    with receiving(Receiver()) as target, _stack(config, auth, ring, "c-kept") as (app, _r):
        topic = TopicClient(app.test_client(), auth, max_attempts=1, delivery={
            "mode": "webhook", "url": target.url, "timeout_seconds": 1})
        assert topic.enqueue(id="accepted").status_code == 201
        assert target.wait_distinct(1, 10)
        time.sleep(7)  # past its lease (1 s timeout + 5 s margin)
        assert topic.get("accepted").get_json()["state"] == "leased"
        cancel = topic.client.delete(topic.url("/messages/accepted"), headers=auth)
        assert cancel.status_code == 409, cancel.get_json()
        failing.clear()
        _wait(lambda: topic.get("accepted").get_json()["state"] == "delivered", 10,
              "the kept outcome was not written")
        time.sleep(1)
        assert target.ids() == ["accepted"]


KILL_PORT = 18097


class _Http:
    """Calls to a served API as one tenant, with timeouts on every socket."""

    def __init__(self, base: str, key: str) -> None:
        import urllib3

        self.base = base
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.pool = urllib3.PoolManager(maxsize=8, retries=False,
                                        timeout=urllib3.Timeout(connect=2, read=10))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self.pool.request(method, self.base + path, headers=self.headers,
                                 body=None if body is None else json.dumps(body))

    def consume(self, topic: str, handed: list[tuple[str, int, int]],
                stop: threading.Event, clock: Callable[[], int] = now_ms) -> None:
        """Lease one at a time and ack, recording (id, deliver_at, received) of each
        hand-out, received by `clock` (the served stack's: epoch ms); a call whose API
        worker was killed is made again (an ack until answered, for up to 10 s)."""
        import urllib3

        while not stop.is_set():
            try:
                answer = self.call("POST", f"/v1/topics/{topic}/leases",
                                   {"max": 1, "wait_ms": 500})
                messages = answer.json()["messages"] if answer.status == 200 else []
            except urllib3.exceptions.HTTPError:
                continue
            for m in messages:
                handed.append((m["id"], parse_instant(m["deliver_at"]), clock()))
                time.sleep(0.01)
                for _ in range(100):
                    with contextlib.suppress(urllib3.exceptions.HTTPError):
                        self.call("POST", f"/v1/topics/{topic}/messages/{m['id']}/ack",
                                  {"lease_token": m["lease"]["token"]})
                        break
                    time.sleep(0.1)


@contextmanager
def _served_stack(config: Config, ring: dict[str, Any], members: list[str],
                  port: int = KILL_PORT, workers: int = 2, extra_env: dict[str, str] | None = None,
                  ready_path: str = "/readyz") -> Iterator[tuple[Any, dict[str, Any]]]:
    """gunicorn with `workers` workers on `port` and releaser processes `members`, on the
    test keyspace and ring, every process with `extra_env` (DUETIME_* settings) besides, the
    API ready once `ready_path` answers 200 (/healthz for a clock moved off Cassandra's, which
    /readyz answers 503): (the API process, {member: its process})."""
    import os
    import subprocess
    import sys

    from tests.serving import ROOT, start_api, wait_ready

    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace,
           "DUETIME_HTTP_PORT": str(port), "DUETIME_WEB_WORKERS": str(workers),
           "DUETIME_RELEASE_RING": str(ring["release_ring"]), "DUETIME_RELEASE_SLOTS": str(SLOTS),
           "DUETIME_RELEASE_LEASE_MS": "2000", "DUETIME_RELEASE_RESCAN_MS": "50",
           "DUETIME_WAKE_PORT": "0", "DUETIME_RELEASER_METRICS_PORT": "0",
           "DUETIME_RATE_LIMIT_PER_S": "0", "DUETIME_API_METRICS_PORT": "0", **(extra_env or {})}
    api_process = start_api(env)
    processes = {m: subprocess.Popen([sys.executable, "-m", "app.cli", "releaser", "--member", m],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL) for m in members}
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", api_process, path=ready_path), \
            "API did not start"
        yield api_process, processes
    finally:
        for process in [*processes.values(), api_process]:
            process.terminate()
        for process in [*processes.values(), api_process]:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _kill_with_children(pid: int) -> None:
    import os
    import signal

    from tests.faults.stack import children

    for child in children(pid):
        os.kill(child, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def test_killed_releasers_and_api_workers_spend_no_attempt_of_a_message_nobody_received(
        config: Config, services: Any, ring: dict[str, Any]) -> None:
    """A busy pull topic with max_attempts 1 and 10 s leases, two consumers taking one at a
    time through a gunicorn API of two workers, served by two releasers. One releaser is
    killed (SIGKILL), later one API worker: the only messages made dead are those whose
    answers were in flight then (at most one per consumer and kill), every other message is
    delivered once, none early, none handed to two consumers."""
    from tests.faults.stack import children

    tenant = f"kill{now_ms()}"
    http = _Http(f"http://127.0.0.1:{KILL_PORT}", services.keys.create(tenant))
    ids = [f"k{i:03d}" for i in range(400)]

    def states() -> Counter[str]:  # the rows' truth: a killed process's counters are lost
        uid = services.topics.get(tenant, "busy").uid
        return Counter(row.state for row in services.messages.get_many(uid, ids).values())

    handed: list[tuple[str, int, int]] = []
    stop = threading.Event()
    consumers = [threading.Thread(target=http.consume, args=("busy", handed, stop), daemon=True)
                 for _ in range(2)]
    with _served_stack(config, ring, ["c-kill-a", "c-kill-b"]) as (api_process, releasers):
        assert http.call("PUT", "/v1/topics/busy", {"max_attempts": 1, "lease_seconds": 10}
                         ).status in (200, 201)
        for n in range(0, 400, 100):
            assert http.call("POST", "/v1/topics/busy/messages:batch", {"messages": [
                {"id": i, "payload": {}} for i in ids[n:n + 100]]}).status == 200
        for c in consumers:
            c.start()
        try:
            _wait(lambda: len(handed) >= 100, 60, "nothing was handed out")
            _kill_with_children(releasers["c-kill-a"].pid)
            _wait(lambda: len(handed) >= 200, 60, "the releaser left did not take over")
            _kill_with_children(children(api_process.pid)[0])

            _wait(lambda: states()["delivered"] + states()["dead"] == len(ids), 90,
                  "not every message was delivered or made dead")
        finally:
            stop.set()
            for c in consumers:
                c.join(15)
        counts = states()
    received = [h[0] for h in handed]
    assert len(received) == len(set(received))  # none handed to two consumers
    assert all(deliver_at <= at for _, deliver_at, at in handed)
    assert counts["dead"] <= 4, counts  # two kills, two answers in flight at most each
    assert counts["delivered"] >= 396
