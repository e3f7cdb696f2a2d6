"""schemathesis against openapi.yaml (the committed document, which test_openapi checks is the
generated one): every route, generated valid and invalid input, every check of schemathesis
(no 5xx; status codes, content types, headers and bodies as documented; invalid data refused;
a request without its key refused). A fixed seed and DUETIME_FUZZ_EXAMPLES examples per
operation (10 here; `make fuzz` runs more) keep it repeatable. Served in-process (WSGI) on the
real node."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis import DataGenerationMethod
from schemathesis.checks import ALL_CHECKS, negative_data_rejection

from app import create_app
from app.config import Config
from tests.conftest import new_tenant_key

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("DUETIME_FUZZ_EXAMPLES", "10"))
_AUTH: dict[str, str] = {}


@pytest.fixture(scope="module")
def api_schema(config: Config) -> Iterator[Any]:
    app = create_app(config)
    _AUTH.update(new_tenant_key(app.extensions["duetime"], "fuzz")[1])
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    yield schemathesis.from_dict(document, app=app, data_generation_methods=[
        DataGenerationMethod.positive, DataGenerationMethod.negative])
    app.extensions["duetime"].close()


schema = schemathesis.from_pytest_fixture("api_schema")


@schemathesis.auth()
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
    response = case.call()
    operation = case.operation
    headers = [h for h in operation.headers if h.name != "Authorization"]  # (the key)
    takes_input = bool(headers) or any(
        len(part) for part in (operation.path_parameters, operation.query, operation.body))
    # an operation without input has no negative data to make: its "negative" cases differ
    # only in the key, which the auth above sets right (the ignored-auth check tries others)
    checks = ALL_CHECKS if takes_input else tuple(
        c for c in ALL_CHECKS if c is not negative_data_rejection)
    case.validate_response(response, checks=checks)
