"""Readiness follows the node: 503 with a retry hint while it is stopped, 200 once it is back.

The node stopped is the tests' own single node `solo` (devstack/cassandra.py, port 9044),
started here and stopped at the end: the dev node, and a user's stack on it, keep running.
Named test_zz_* so it runs last.
"""

from __future__ import annotations

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
