"""Tests that run releasers of their own: a keyspace of their own (`config` and `services`
overridden here), which the suite's releaser (tests/conftest.py) does not serve, so each test
decides which releasers run and when."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.config import Config
from app.services import Services
from tests.conftest import own_keyspace


@pytest.fixture(scope="session")
def config() -> Iterator[Config]:
    with own_keyspace("releasers") as cfg:
        yield cfg


@pytest.fixture(scope="session")
def services(config: Config) -> Iterator[Services]:
    svc = Services(config)
    yield svc
    svc.close()
