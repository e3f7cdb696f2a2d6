"""Long polls cannot take the API down (app.delivery.waits): a thousand waiting lease calls of
ten tenants are all held and answered by their wait while health, an enqueue and an ack of
another tenant answer promptly; a tenant past its share of waits gets 429 at once; a client
that leaves frees its wait within a second. Real gunicorn on loopback, the suite's releaser."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import Config
from app.services import Services
from tests.conftest import new_tenant_key
from tests.raw_http import Answer, call, send
from tests.serving import serving

PORT = 18121
METRICS_PORT = 19481
CAPPED_PORT = 18122
WAITS = 1000
TENANTS = 10
WAIT_MS = 10_000
PROBES = 100  # of each kind: p99 is the second slowest, not the slowest of a few


def _waiting() -> int:
    """Lease calls the served API's workers hold waiting now (their metrics, added up)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("duetime_lease_waits "):
                return int(float(line.split()[1]))
    return 0


async def _all_held(n: int, within_s: float) -> float:
    """The moment (monotonic s) the API holds n waiting calls; fails past within_s."""
    deadline = time.monotonic() + within_s
    while (held := await asyncio.to_thread(_waiting)) < n:
        assert time.monotonic() < deadline, f"{held} of {n} calls held"
        await asyncio.sleep(0.05)
    return time.monotonic()


def _p99(seconds: list[float]) -> float:
    """The nearest-rank 99th percentile: of 100, the second slowest."""
    ordered = sorted(seconds)
    return ordered[math.ceil(len(ordered) * 0.99) - 1]


@pytest.fixture(scope="module")
def api(config: Config) -> Iterator[str]:
    with serving(config.keyspace, PORT, DUETIME_WEB_WORKERS="2",
                 DUETIME_API_METRICS_PORT=str(METRICS_PORT)) as base:
        yield base


def _topic(port: int, auth: dict[str, str]) -> str:
    name = f"polls-{secrets.token_hex(3)}"
    answer = asyncio.run(call(port, "PUT", f"/v1/topics/{name}", auth, {}))
    assert answer.status == 201, answer
    return name


def test_a_thousand_long_polls_of_ten_tenants_leave_the_api_answering(
        api: str, services: Services) -> None:
    tenants = [new_tenant_key(services, "poll")[1] for _ in range(TENANTS)]
    topics = [_topic(PORT, auth) for auth in tenants]
    other = new_tenant_key(services, "other")[1]
    other_topic = _topic(PORT, other)
    other_url = f"/v1/topics/{other_topic}"

    async def run() -> None:
        # leases of the other tenant, to ack while the waits are held
        for i in range(PROBES):
            answer = await call(PORT, "POST", f"{other_url}/messages", other,
                                {"id": f"m{i}", "payload": i})
            assert answer.status == 201, answer
        leases: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(leases) < PROBES and time.monotonic() < deadline:
            answer = await call(PORT, "POST", f"{other_url}/leases", other,
                                {"max": PROBES - len(leases), "wait_ms": 2000,
                                 "lease_seconds": 120})
            assert answer.status == 200, answer
            leases += answer.json()["messages"]
        assert len(leases) == PROBES

        sent = await asyncio.gather(*[send(
            PORT, "POST", f"/v1/topics/{topics[i % TENANTS]}/leases", tenants[i % TENANTS],
            {"max": 1, "wait_ms": WAIT_MS}) for i in range(WAITS)])
        polls = [asyncio.create_task(s.answer()) for s in sent]
        held_at = await _all_held(WAITS, within_s=WAIT_MS / 1000 / 2)
        # one message for each tenant, due now: one of its waiting calls gets it
        for topic, auth in zip(topics, tenants, strict=True):
            answer = await call(PORT, "POST", f"/v1/topics/{topic}/messages", auth,
                                {"id": "for-a-poll", "payload": 1})
            assert answer.status == 201, answer
        probes: dict[str, list[float]] = {"healthz": [], "readyz": [], "enqueue": [],
                                          "ack": []}
        for i, lease in enumerate(leases):
            for name, (method, path, body) in {
                    "healthz": ("GET", "/healthz", None),
                    "readyz": ("GET", "/readyz", None),
                    "enqueue": ("POST", f"{other_url}/messages",
                                {"id": f"p{i}", "payload": i, "delay_ms": 600_000}),
                    "ack": ("POST", f"{other_url}/messages/{lease['id']}/ack",
                            {"lease_token": lease["lease"]["token"]}),
            }.items():
                answer = await call(PORT, method, path, other, body)
                assert answer.status in (200, 201, 204), (name, answer)
                probes[name].append(answer.took_s)
            await asyncio.sleep(0.01)
        answered: list[Answer] = await asyncio.gather(*polls)
        done_at = time.monotonic()
        statuses = [a.status for a in answered]
        assert statuses.count(200) == WAITS, {s: statuses.count(s) for s in set(statuses)}
        got = sum(len(a.json()["messages"]) for a in answered)
        assert got == TENANTS  # each tenant's message went to one of its calls
        # every call was held by held_at: none outlived its wait by a second
        assert done_at < held_at + WAIT_MS / 1000 + 1.0, done_at - held_at
        for name, took in probes.items():
            assert _p99(took) < 0.1, (name, sorted(took)[-5:])

    asyncio.run(run())


@pytest.fixture(scope="module")
def capped(config: Config) -> Iterator[str]:
    with serving(config.keyspace, CAPPED_PORT, DUETIME_API_WAITS="8",
                 DUETIME_API_WAITS_PER_TENANT="5") as base:
        yield base


def test_a_tenant_past_its_share_of_waits_is_refused_at_once_and_a_gone_client_frees_its_wait(
        capped: str, services: Services) -> None:
    auth = new_tenant_key(services, "cap")[1]
    path = f"/v1/topics/{_topic(CAPPED_PORT, auth)}/leases"
    others = new_tenant_key(services, "cap")[1]
    other_path = f"/v1/topics/{_topic(CAPPED_PORT, others)}/leases"
    waiting = {"max": 1, "wait_ms": 20_000}

    async def run() -> None:
        held = [await send(CAPPED_PORT, "POST", path, auth, waiting) for _ in range(5)]
        await asyncio.sleep(0.5)
        refused = await call(CAPPED_PORT, "POST", path, auth, waiting)
        assert refused.status == 429, refused
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["type"].endswith("/too-many-waits")
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.took_s < 1.0
        # a call that does not wait is never refused for the tenant's waits
        short = await call(CAPPED_PORT, "POST", path, auth, {"max": 1, "wait_ms": 0})
        assert short.status == 200, short
        # another tenant's waits fill the process's total: 503 past it
        held += [await send(CAPPED_PORT, "POST", other_path, others, waiting)
                 for _ in range(3)]
        await asyncio.sleep(0.5)
        full = await call(CAPPED_PORT, "POST", other_path, others, waiting)
        assert full.status == 503 and "retry-after" in full.headers, full
        # the clients leave: their waits are free within a second
        for s in held:
            s.leave()
        await asyncio.sleep(1.0)
        again = [await send(CAPPED_PORT, "POST", path, auth, {"max": 1, "wait_ms": 1000})
                 for _ in range(5)]
        answers = [await s.answer() for s in again]
        assert [a.status for a in answers] == [200] * 5, answers

    asyncio.run(run())
