"""The releaser's HTTP client and POST process against real local servers (no Cassandra).

Servers here are raw asyncio socket servers, so each test decides the exact bytes of the
answer: chunked bodies, bodies ended by closing, idle connections the server drops, silence.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from app.delivery.webhook_targets import parse_allow
from tests.loop_thread import LoopThread
from tests.receiver import Receiver, receiving
from workers.http_client import AsyncHttpClient, HttpError, RefusedTarget
from workers.loop import PrioritySlots
from workers.post_process import PostJob, PostProcess, PostResult
from workers.webhook import post_outcome

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LOOPBACK_TEXT = "127.0.0.0/8,::1"  # these servers listen on loopback
LOOPBACK = parse_allow(LOOPBACK_TEXT)


@contextmanager
def raw_server(handler: Handler) -> Iterator[tuple[LoopThread, str, list[int]]]:
    """(loop, url, connections accepted so far) of a server running handler per connection."""
    runner = LoopThread("raw-server")
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(on_connect, "127.0.0.1", 0)

    server = runner.run(start())
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        yield runner, url, accepted
    finally:
        async def stop() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()  # handlers still waiting on their clients

        runner.run(stop())
        runner.stop()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)


def post(runner: LoopThread, client: AsyncHttpClient, url: str,
         timeout_s: float = 5) -> tuple[int, bytes]:
    return runner.run(client.post(url, b'{"n":1}', {"X-Test": "1"}, timeout_s))


def test_chunked_answers_are_read_whole_and_the_connection_is_reused() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            assert body == b'{"n":1}'
            writer.write(b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            await writer.drain()

    with raw_server(chunked) as (runner, url, accepted):
        client = AsyncHttpClient(LOOPBACK)
        assert [post(runner, client, url) for _ in range(3)] == [(202, b"abcde")] * 3
        assert len(accepted) == 1


def test_an_answer_ended_by_closing_the_connection_counts() -> None:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\nbroken")
        await writer.drain()

    with raw_server(closing) as (runner, url, accepted):
        client = AsyncHttpClient(LOOPBACK)
        assert post(runner, client, url) == (500, b"broken")
        assert post(runner, client, url) == (500, b"broken")
        assert len(accepted) == 2  # not kept: the server closed it


def test_an_interim_100_continue_is_passed_over_for_the_final_answer() -> None:
    """A 1xx answer is not the outcome: a target answering 100 Continue, then 200, was
    taken as "HTTP 100" (a failure) and its messages went dead after every 200."""
    async def continuing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                         b"Link: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    with raw_server(continuing) as (runner, url, accepted):
        client = AsyncHttpClient(LOOPBACK)
        assert [post(runner, client, url) for _ in range(2)] == [(200, b"ok")] * 2
        assert len(accepted) == 1


def test_a_connection_the_server_dropped_while_idle_is_replaced() -> None:
    async def one_per_connection(reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # keep-alive was promised, but the server drops the connection without a word

    with raw_server(one_per_connection) as (runner, url, accepted):
        client = AsyncHttpClient(LOOPBACK)
        assert post(runner, client, url) == (200, b"ok")
        time.sleep(0.05)
        assert post(runner, client, url) == (200, b"ok")
        assert len(accepted) == 2


def test_a_reused_connection_closed_before_any_answer_is_retried_once_on_a_new_one() -> None:
    async def answers_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # the second request on this connection: hang up on it

    with raw_server(answers_once) as (runner, url, accepted):
        client = AsyncHttpClient(LOOPBACK)
        assert post(runner, client, url) == (200, b"ok")
        assert post(runner, client, url) == (200, b"ok")
        assert len(accepted) == 2


def test_a_silent_target_times_out_and_garbage_is_an_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    with raw_server(silent) as (runner, url, _):
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            post(runner, AsyncHttpClient(LOOPBACK), url, timeout_s=0.3)
        assert 0.3 <= time.monotonic() - began < 2
        outcome = runner.run(post_outcome(AsyncHttpClient(LOOPBACK), url, {}, b"x", 0.2))
        assert outcome == "timeout after 0.2 s"
    with raw_server(garbage) as (runner, url, _), pytest.raises(HttpError):
        post(runner, AsyncHttpClient(LOOPBACK), url)


def test_outcomes_name_refusals_and_statuses() -> None:
    runner = LoopThread("outcomes")
    try:
        refused = runner.run(post_outcome(AsyncHttpClient(LOOPBACK), "http://127.0.0.1:9/x",
                                          {}, b"", 2))
        assert refused == "connection failed: Connection refused"
        for bad in ("ftp://x/", "http://127.0.0.1:port/x"):
            not_http = runner.run(post_outcome(AsyncHttpClient(LOOPBACK), bad, {}, b"", 2))
            assert not_http is not None and "not an http(s) URL" in not_http, not_http
        with receiving(Receiver(lambda message_id, before: 503)) as target:
            answer = runner.run(post_outcome(AsyncHttpClient(LOOPBACK), target.url,
                                             {"Duetime-Message-Id": "m1"}, b"{}", 2))
            assert answer == "HTTP 503: ok"
            assert target.ids() == ["m1"]
    finally:
        runner.stop()


def on_a_loop(scenario: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to its end on an event loop thread of its own."""
    runner = LoopThread("scenario")
    try:
        runner.run(scenario)
    finally:
        runner.stop()


def test_priority_slots_go_to_the_lowest_priority_value_first() -> None:
    order: list[str] = []

    async def scenario() -> None:
        slots = PrioritySlots(1)
        await slots.acquire(100, 0)  # held: everyone else queues

        async def wait(name: str, priority: int, due_ms: int) -> None:
            await slots.acquire(priority, due_ms)
            order.append(name)
            slots.release()

        tasks = [asyncio.ensure_future(wait(n, p, d)) for n, p, d in
                 [("late-low", 5, 20), ("high", 200, 0), ("early-low", 5, 10)]]
        await asyncio.sleep(0.01)
        slots.release()
        await asyncio.gather(*tasks)
        assert slots.free == 1

    on_a_loop(scenario())
    assert order == ["early-low", "late-low", "high"]


def test_priority_slots_take_turns_across_groups_behind_a_backlog() -> None:
    order: list[str] = []

    async def scenario() -> None:
        slots = PrioritySlots(1)
        await slots.acquire(100, 0)  # held: everyone else queues

        async def wait(name: str, group: str, due_ms: int) -> None:
            await slots.acquire(100, due_ms, group)
            order.append(name)
            slots.release()

        tasks = [asyncio.ensure_future(wait(f"big{n}", "big", n)) for n in range(50)]
        await asyncio.sleep(0.01)
        tasks += [asyncio.ensure_future(wait(f"small{n}", "small", 100 + n)) for n in range(3)]
        await asyncio.sleep(0.01)
        slots.release()
        await asyncio.gather(*tasks)

    on_a_loop(scenario())
    # the backlog's first, then turns: small goes at once, not after the 50
    assert order[:7] == ["big0", "small0", "big1", "small1", "big2", "small2", "big3"], order
    assert order[7:] == [f"big{n}" for n in range(4, 50)]


def job(ref: int, url: str, due_ms: int, start_by_ms: int | None = None) -> PostJob:
    return PostJob(ref=ref, topic="t", concurrency=4, due_ms=due_ms,
                   start_by_ms=start_by_ms if start_by_ms is not None else due_ms + 60_000,
                   priority=100, group=None, url=url, headers={"Duetime-Message-Id": f"m{ref}"},
                   body=b"{}", timeout_s=5)


class Results:
    def __init__(self) -> None:
        self.got: dict[int, PostResult] = {}
        self.lost: list[int] = []
        self.changed = threading.Condition()

    def add(self, results: list[PostResult]) -> None:
        with self.changed:
            self.got.update((r.ref, r) for r in results)
            self.changed.notify_all()

    def add_lost(self, refs: list[int]) -> None:
        with self.changed:
            self.lost.extend(refs)
            self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_the_post_process_sends_at_the_due_time_never_before() -> None:
    results = Results()
    with receiving(Receiver()) as target:
        posts = PostProcess(results.add, results.add_lost, LOOPBACK_TEXT)
        try:
            due = now_ms() + 1500  # the child may still be starting: plenty of room
            posts.send([job(i, target.url, due + 10 * i) for i in range(20)])
            posts.send([job(99, target.url, now_ms() - 5, start_by_ms=now_ms() - 1)])
            assert results.wait(lambda: len(results.got) == 21, 15)
        finally:
            posts.stop()
    assert results.got[99] == PostResult(99, False, None)  # too late to start: not sent
    for i in range(20):  # posted, answered 2xx, and started no earlier than its due time
        got = results.got[i]
        assert (got.ref, got.posted, got.error) == (i, True, None), got
        assert got.started_ms >= due + 10 * i, (i, got.started_ms - due - 10 * i)
    arrived = {a.message_id: a.received_ms for a in target.arrivals}
    assert set(arrived) == {f"m{i}" for i in range(20)}
    for i in range(20):
        assert arrived[f"m{i}"] >= due + 10 * i, (i, arrived[f"m{i}"] - due - 10 * i)


def test_stop_waits_for_jobs_due_later() -> None:
    results = Results()
    with receiving(Receiver()) as target:
        posts = PostProcess(results.add, results.add_lost, LOOPBACK_TEXT)
        due = now_ms() + 1500
        posts.send([job(1, target.url, due)])
        posts.stop()
        assert now_ms() >= due
        assert list(results.got) == [1]
        got = results.got[1]
        assert (got.posted, got.error) == (True, None) and got.started_ms >= due
        assert target.ids() == ["m1"]


def test_a_killed_post_process_hands_back_its_jobs_and_is_replaced() -> None:
    results = Results()
    with receiving(Receiver()) as target:
        posts = PostProcess(results.add, results.add_lost, LOOPBACK_TEXT)
        try:
            posts.send([job(1, target.url, now_ms() + 60_000)])
            child = posts._child
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join(5)
            # sent as the child is found dead: reported lost, or posted by the next child
            posts.send([job(3, target.url, now_ms())])
            assert results.wait(lambda: 1 in results.lost and (
                3 in results.lost or 3 in results.got), 10), (results.lost, results.got)
            posts.send([job(2, target.url, now_ms())])
            assert results.wait(lambda: 2 in results.got, 15)
            assert posts._child.pid != child.pid
        finally:
            posts.stop()
    assert set(target.ids()) <= {"m2", "m3"} and "m2" in target.ids()
    assert ("m3" in target.ids()) == (3 in results.got)


def test_a_target_on_a_refused_address_is_never_connected_to() -> None:
    """Without an allow list, a name resolving to loopback is refused before connecting (the
    server sees no connection), and the POST's outcome says why."""
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise AssertionError("connected")

    with raw_server(never) as (runner, url, accepted):
        named = url.replace("127.0.0.1", "localhost")
        with pytest.raises(RefusedTarget, match="loopback"):
            post(runner, AsyncHttpClient(), named)
        outcome = runner.run(post_outcome(AsyncHttpClient(), url, {}, b"x", 1.0))
        assert outcome is not None and "refused" in outcome and "loopback" in outcome
        assert accepted == []
