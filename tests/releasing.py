"""Helpers of the tests that need a releaser: one in-process releaser on a keyspace, a
keyspace of one's own, webhook topics and what their POSTs must be."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import standardwebhooks
from flask.testing import FlaskClient

from app import create_app
from app.config import Config
from app.core.timeparse import parse_instant
from app.services import Clock, Services, system_clock_ms
from tests.conftest import FAST, new_tenant_key, own_keyspace
from tests.consumers import TopicClient
from tests.receiver import Arrival
from tests.waiting import wait_until
from workers.releaser import Releaser


@contextmanager
def releaser(config: Config, member: str, *, clock: Clock = system_clock_ms,
             **settings: Any) -> Iterator[Releaser]:
    """An in-process releaser on the test keyspace (FAST, then `settings`) on `clock` (epoch
    ms), stopped gracefully afterwards."""
    services = Services(config.replace(**{**FAST, **settings}), clock)
    r = Releaser(services, member)
    r.start()
    try:
        yield r
    finally:
        r.stop()
        services.close()


@contextmanager
def keyspace_alone(label: str) -> Iterator[tuple[Config, Services, FlaskClient, dict[str, str]]]:
    """A keyspace of its own: its config, services, an API client and a tenant's key. For a
    test that times what a releaser's runs over every topic find: in the shared keyspace
    they work through whatever the tests before it left awake."""
    with own_keyspace(label) as cfg:
        svc = Services(cfg)
        app = create_app(cfg)
        try:
            yield cfg, svc, app.test_client(), new_tenant_key(svc)[1]
        finally:
            app.extensions["duetime"].close()
            svc.close()


def webhook_topic(client: FlaskClient, auth: dict[str, str], url: str,
                  **settings: Any) -> tuple[TopicClient, str]:
    """A webhook topic and its signing secret."""
    topic = TopicClient(client, auth, delivery={"mode": "webhook", "url": url,
                                                "timeout_seconds": 5}, **settings)
    secret = client.get(topic.url(), headers=auth).get_json()["signing_secret"]
    return topic, secret


def assert_on_time_and_signed(arrivals: list[Arrival], secret: str, topic: str) -> None:
    for n, a in enumerate(arrivals):
        deliver_at = parse_instant(a.headers["Duetime-Deliver-At"])
        assert a.received_ms >= deliver_at, f"early by {deliver_at - a.received_ms} ms: {a}"
        assert a.headers["Duetime-Topic"] == topic, a
        # the reference library checks the signature and that the timestamp is recent
        standardwebhooks.Webhook(secret).verify(a.body, a.headers, json_parse=False)
        key = base64.b64decode(secret.removeprefix("whsec_"))
        expected = hmac.new(key, a.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(a.headers["Duetime-Signature"], expected), (
            f"arrival {n} of {len(arrivals)}: bad signature: {a.headers} {a.body!r}")


def wait_state(topic: TopicClient, message_id: str, state: str, within_s: float) -> Any:
    deadline = time.monotonic() + within_s
    body = None
    while time.monotonic() < deadline:
        body = topic.get(message_id).get_json()
        if body["state"] == state:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{message_id} still {body}")


def wait_served(client: FlaskClient, auth: dict[str, str], topic: str,
                within_s: float = 10) -> None:
    """Until the API process of `client` can reach a releaser owning the topic's shards (its
    lease calls are served by them; it reads who they are at most once a second)."""
    services: Services = client.application.extensions["duetime"]
    found = services.topics.get(tenant_of(services, auth), topic)
    assert found is not None
    assert wait_until(lambda: services.desk.serves(found), within_s), "no releaser serves it"


def tenant_of(services: Services, auth: dict[str, str]) -> str:
    tenant = services.keys.tenant_of(auth["Authorization"].split()[1])
    assert tenant is not None
    return tenant
