"""schemathesis 4 against the served openapi.yaml (which test_openapi checks is the committed,
generated one): every route, its examples, its coverage cases and generated valid and invalid
input, every check of schemathesis (no 5xx; status codes, content types, headers and bodies
as documented; invalid data refused; undeclared methods 405 with Allow; a request without
its key refused). Seed 1 and DUETIME_FUZZ_EXAMPLES generated examples per operation (10
here; `make fuzz` runs more) keep it repeatable. Served in-process (WSGI) on the real node."""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

from app import create_app
from app.config import Config
from tests.conftest import new_tenant_key

EXAMPLES = int(os.environ.get("DUETIME_FUZZ_EXAMPLES", "10"))
_AUTH: dict[str, str] = {}

# What the document's formats mean, for generating valid input: instants from a day ago to
# 300 days ahead (any later one is taken too, parked at the horizon: tests/test_far_future.py
# covers those), wall times without offset, cron lines, base64. (Zones need none: the
# document gives them as an enum.)
_NOW = dt.datetime.now(dt.UTC)
_SOON = st.datetimes(min_value=(_NOW - dt.timedelta(days=1)).replace(tzinfo=None),
                     max_value=(_NOW + dt.timedelta(days=300)).replace(tzinfo=None))
schemathesis.openapi.format("date-time", _SOON.map(
    lambda t: t.replace(tzinfo=dt.UTC).isoformat(timespec="milliseconds")))
schemathesis.openapi.format("date-time-local", _SOON.map(
    lambda t: t.isoformat(timespec="seconds")))
schemathesis.openapi.format("cron", st.sampled_from(
    ["0 9 * * MON-FRI", "*/5 * * * *", "30 8 1 * *", "15 0 9 * * *", "0 0 29 2 *"]))
schemathesis.openapi.format("byte", st.binary(max_size=64).map(
    lambda b: base64.b64encode(b).decode()))


@pytest.fixture(scope="module")
def api_schema(config: Config) -> Iterator[Any]:
    app = create_app(config)
    _AUTH.update(new_tenant_key(app.extensions["duetime"], "fuzz")[1])
    yield schemathesis.openapi.from_wsgi(
        "/openapi.yaml", app, config=SchemathesisConfig.from_dict({"seed": 1}))
    app.extensions["duetime"].close()


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.auth()
class TenantKey:
    """The fuzz tenant's key on every generated request (the ignored-auth check then sends
    the same request without it and with a wrong one)."""

    def get(self, case: Any, context: Any) -> str:
        return _AUTH["Authorization"]

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": data}


@schema.parametrize()
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: Any) -> None:
    case.call_and_validate()
