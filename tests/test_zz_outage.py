"""Readiness follows the node: 503 with a retry hint while it is stopped, 200 once it is back.

Named test_zz_* so it runs last: it stops the shared dev node for a few seconds.
"""

from __future__ import annotations

import time

import pytest
from flask.testing import FlaskClient

from tests.conftest import devstack

pytestmark = pytest.mark.outage


def _poll(client: FlaskClient, want: int, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    status = 0
    while time.monotonic() < deadline:
        status = client.get("/readyz").status_code
        if status == want:
            return status
        time.sleep(0.5)
    return status


def test_readyz_turns_503_when_node_stops_and_200_when_back(client: FlaskClient) -> None:
    assert client.get("/readyz").status_code == 200
    devstack("stop", "dev")
    try:
        assert _poll(client, 503, within_s=30) == 503
        down = client.get("/readyz")
        assert down.content_type == "application/problem+json"
        assert int(down.headers["Retry-After"]) > 0
        assert client.get("/healthz").status_code == 200
    finally:
        devstack("start", "dev")
    assert _poll(client, 200, within_s=60) == 200
