"""Per-tenant quotas (app/ops/quotas.py) on the real node: two API processes share one tenant's
allowance of a second through Cassandra; past it, 429 problem+json with Retry-After; other
tenants are not touched; the burst carries what a quiet second left unused; a batch bigger
than any second's allowance is 413."""

from __future__ import annotations

import time

from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.config import Config
from app.ops.quotas import SYNC_MS
from app.services import Services
from tests.conftest import new_tenant_key
from tests.consumers import now_ms


def _at_a_second_start() -> None:
    """Wait for the start of a wall-clock second (the quota's window)."""
    time.sleep((1000 - now_ms() % 1000) / 1000 + 0.005)


def _statuses(client: FlaskClient, headers: dict[str, str], count: int) -> list[int]:
    return [client.get("/v1/topics", headers=headers).status_code for _ in range(count)]


def test_two_processes_share_a_tenants_requests_of_a_second(config: Config) -> None:
    limited = config.replace(rate_limit_per_s=5.0)
    first, second = create_app(limited), create_app(limited)
    services: Services = first.extensions["duetime"]
    _, headers = new_tenant_key(services)
    _, other = new_tenant_key(services)
    a, b = first.test_client(), second.test_client()
    for _ in range(3):  # a second of the same shape, until one fits in its wall second
        _at_a_second_start()
        began = now_ms()
        mine = _statuses(a, headers, 3)
        time.sleep(3 * SYNC_MS / 1000)  # both processes have synced
        theirs = _statuses(b, headers, 5)
        refused = b.get("/v1/topics", headers=headers)
        untouched = _statuses(b, other, 5)
        if now_ms() // 1000 == began // 1000:
            break
    assert now_ms() // 1000 == began // 1000, "the requests did not fit in one second"
    assert mine == [200] * 3
    assert theirs == [200, 200, 429, 429, 429]  # 5 a second for the tenant, both together
    assert refused.status_code == 429
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    assert refused.headers["Retry-After"] == "1"
    assert refused.get_json()["type"].endswith("rate-limited")
    assert untouched == [200] * 5  # another tenant's quota is its own
    _at_a_second_start()
    assert _statuses(b, headers, 5) == [200] * 5  # a new second, a new allowance
    for app in (first, second):
        app.extensions["duetime"].close()


def test_a_quiet_second_leaves_a_burst_and_messages_have_their_own_quota(
        config: Config) -> None:
    app: Flask = create_app(config.replace(rate_limit_per_s=2.0, rate_burst=3,
                                           message_rate_limit_per_s=10.0))
    services: Services = app.extensions["duetime"]
    _, headers = new_tenant_key(services)
    client = app.test_client()
    _at_a_second_start()
    assert _statuses(client, headers, 6) == [200] * 5 + [429]  # 2 a second + a burst of 3
    _at_a_second_start()
    assert _statuses(client, headers, 3) == [200, 200, 429]  # the second before used it all
    time.sleep(1.1)  # a quiet second
    _at_a_second_start()
    assert client.put("/v1/topics/q", headers=headers, json={}).status_code in (200, 201)
    batch = {"messages": [{"payload": {"n": n}} for n in range(8)]}
    assert client.post("/v1/topics/q/messages:batch", headers=headers,
                       json=batch).status_code == 200
    over = client.post("/v1/topics/q/messages:batch", headers=headers,
                       json={"messages": [{"payload": {}}] * 3})
    assert over.status_code == 429 and over.get_json()["type"].endswith("rate-limited")
    huge = client.post("/v1/topics/q/messages:batch", headers=headers,
                       json={"messages": [{"payload": {}}] * 11})
    assert huge.status_code == 413
    app.extensions["duetime"].close()
