"""The client's own tests run where only the client is installed (tests/distributions.py of
the project builds that virtualenv and serves the API): DUETIME_TEST_URL and
DUETIME_TEST_KEY name a served API and a key of a tenant of its own."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from duetime_client import Client


@pytest.fixture()
def url() -> str:
    return os.environ["DUETIME_TEST_URL"]


@pytest.fixture()
def key() -> str:
    return os.environ["DUETIME_TEST_KEY"]


@pytest.fixture()
def api(url: str, key: str) -> Iterator[Client]:
    client = Client(url, key)
    yield client
    client.close()


@pytest.fixture()
def topic(api: Client) -> Iterator[str]:
    """A new pull topic; deleted afterwards."""
    name = f"c{secrets.token_hex(4)}"
    api.put_topic(name, lease_seconds=30)
    yield name
    api.delete_topic(name)
