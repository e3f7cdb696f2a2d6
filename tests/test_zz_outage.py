"""Readiness follows the node: 503 with a retry hint while it is stopped, 200 once it is back.

The node stopped is the tests' own single node `solo` (devstack/cassandra.py, port 9044),
started here and stopped at the end: the dev node, and a user's stack on it, keep running.
Named test_zz_* so it runs last.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from app import create_app
from app.config import Config
from app.services import Services
from app.store import migrations
from tests.conftest import _drop_keyspace, devstack

pytestmark = pytest.mark.outage
SOLO_PORT = 9044


@pytest.fixture()
def solo_client(config: Config) -> Iterator[FlaskClient]:
    """A client of an app on the solo node (started for it, stopped afterwards)."""
    devstack("start", "solo")
    solo = config.replace(cql_port=SOLO_PORT)
    services = Services(solo)
    migrations.apply(services.db)
    services.close()
    app = create_app(solo)
    try:
        yield app.test_client()
    finally:
        app.extensions["duetime"].close()
        _drop_keyspace(solo)
        devstack("stop", "solo")


def _poll(client: FlaskClient, want: int, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    status = 0
    while time.monotonic() < deadline:
        status = client.get("/readyz").status_code
        if status == want:
            return status
        time.sleep(0.5)
    return status


def test_readyz_turns_503_when_node_stops_and_200_when_back(
        solo_client: FlaskClient, client: FlaskClient) -> None:
    assert solo_client.get("/readyz").status_code == 200
    devstack("stop", "solo")
    try:
        assert _poll(solo_client, 503, within_s=30) == 503
        down = solo_client.get("/readyz")
        assert down.content_type == "application/problem+json"
        assert int(down.headers["Retry-After"]) > 0
        assert solo_client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200  # the dev node was never touched
    finally:
        devstack("start", "solo")
    assert _poll(solo_client, 200, within_s=60) == 200


def test_a_post_answered_200_while_the_node_is_down_is_delivered_once(
        config: Config, solo_client: FlaskClient) -> None:
    """A webhook POST the target answers 200 just after the node stopped: its outcome cannot
    be written, so the releaser keeps it and writes it once the node is back, past the
    message's lease. The message is POSTed once and ends delivered, not dead (its one
    attempt), and not POSTed again when its lease ran out meanwhile."""
    from tests.consumers import TopicClient
    from tests.receiver import Receiver, receiving
    from tests.releasing import releaser

    solo = config.replace(cql_port=SOLO_PORT)
    services = Services(solo)
    auth = {"Authorization": f"Bearer {services.keys.create('outage')}"}
    services.close()
    gate = threading.Event()
    with receiving(Receiver(gate=gate)) as target, releaser(solo, "outage-r"):
        topic = TopicClient(solo_client, auth, max_attempts=1, delivery={
            "mode": "webhook", "url": target.url, "timeout_seconds": 20})
        assert topic.enqueue(id="accepted").status_code == 201
        deadline = time.monotonic() + 20
        while target.started < 1:
            assert time.monotonic() < deadline, "the POST did not start"
            time.sleep(0.02)
        taken_at = time.monotonic()
        # the target answers 200 once no node can record it: as soon as the node is down
        answering = threading.Thread(target=_open_when_down, args=(gate,), daemon=True)
        answering.start()
        devstack("stop", "solo")
        try:
            answering.join(20)
            assert target.wait_distinct(1, 10)
            time.sleep(max(0.0, taken_at + 26 - time.monotonic()))  # its lease (25 s) ran out
        finally:
            devstack("start", "solo")
        assert _poll(solo_client, 200, within_s=60) == 200
        deadline = time.monotonic() + 60
        while (row := topic.get("accepted").get_json()).get("state") != "delivered":
            assert time.monotonic() < deadline, f"{row.get('state')} {row.get('last_error')}"
            time.sleep(0.2)
        time.sleep(1)
        assert target.ids() == ["accepted"]
        row = topic.get("accepted").get_json()
        assert row["state"] == "delivered" and row["attempts"] == 1, row


def _open_when_down(gate: threading.Event, within_s: float = 20) -> None:
    """Set the gate once the solo node refuses connections."""
    import socket

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", SOLO_PORT), timeout=0.5).close()
        except OSError:
            break
        time.sleep(0.05)
    gate.set()
