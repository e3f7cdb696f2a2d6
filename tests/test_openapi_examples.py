"""Every request example of openapi.yaml is accepted: each operation's examples, as
schemathesis builds them from the document (its examples phase: the request body's and its
fields' examples, the fields that have none filled in), sent to the app on the real node
with the path naming what exists (a topic, a scheduled message, a schedule, a campaign),
must be answered 2xx. A conformance tool sends these first; a client copies them."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from app.services import Services
from tests.conftest import new_tenant_key

# schemathesis' example strategies draw with `random` (a deprecation hypothesis warns of)
pytestmark = pytest.mark.filterwarnings(
    "ignore::hypothesis.errors.HypothesisDeprecationWarning")


def _drawn(strategy: st.SearchStrategy[Any], count: int = 3) -> list[Any]:
    """Up to `count` cases of an examples strategy, the same on every run."""
    cases: list[Any] = []

    @given(strategy)
    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def draw(case: Any) -> None:
        cases.append(case)

    draw()
    return cases


def test_every_request_example_is_accepted(app: Flask, client: FlaskClient,
                                           services: Services) -> None:
    auth = new_tenant_key(services, "examples")[1]
    topic = f"examples-{secrets.token_hex(3)}"
    assert client.put(f"/v1/topics/{topic}", json={}, headers=auth).status_code == 201
    # what the paths name: a scheduled message (due tomorrow) of a campaign, a schedule
    message = client.post(f"/v1/topics/{topic}/messages", headers=auth, json={
        "payload": {"n": 1}, "delay_ms": 86_400_000, "campaign": "spring"})
    assert message.status_code == 201, message.get_json()
    existing = {"topic": topic, "message_id": message.get_json()["id"], "campaign": "spring",
                "name": "nightly"}
    schema = schemathesis.openapi.from_wsgi("/openapi.yaml", app)
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for strategy in operation.get_strategies_from_examples():
            for case in _drawn(strategy):
                unknown = set(case.path_parameters or {}) - set(existing)
                assert not unknown, f"{operation.label}: give the test a {unknown} that exists"
                case.path_parameters = {k: existing[k] for k in case.path_parameters or {}}
                answer = case.call(headers=auth)
                assert 200 <= answer.status_code < 300, (
                    f"{operation.label} example {case.query!r} {case.body!r}: "
                    f"{answer.status_code} "
                    f"{answer.text}")
                sent += 1
    # the operations with examples today: topic PUT, message PATCH, schedule PUT
    assert sent >= 3


def test_zone_fields_take_the_documented_zones(app: Flask, client: FlaskClient,
                                               services: Services) -> None:
    """Each zone field is documented as the TimeZone component, whose enum is what the server
    takes: a zone of it is accepted, a name outside it refused (400), even one this machine
    could load (localtime, from the system's zoneinfo)."""
    spec = app.test_client().get("/openapi.json").get_json()
    zones = spec["components"]["schemas"]["TimeZone"]["enum"]
    assert "Europe/Bucharest" in zones and "UTC" in zones and "localtime" not in zones
    text = app.test_client().get("/openapi.yaml").get_data(as_text=True)
    assert "format: iana-time-zone" in text and text.count("- Europe/Bucharest") == 1

    auth = new_tenant_key(services, "zones")[1]
    topic = f"zones-{secrets.token_hex(3)}"
    base = f"/v1/topics/{topic}"
    schedule = {"cron": "0 9 * * *", "payload": None}
    for zone, status in (("Asia/Kathmandu", (200, 201)), ("localtime", (400,)),
                         ("Mars/Olympus", (400,))):
        quiet = {"quiet_hours": {"start": "21:00", "end": "08:00", "timezone": zone}}
        assert client.put(base, json=quiet, headers=auth).status_code in status, zone
        if zone == "Asia/Kathmandu":
            continue
        assert client.put(f"{base}/schedules/s", json={**schedule, "timezone": zone},
                          headers=auth).status_code == 400, zone
        message = {"payload": 1, "local_time": "2027-01-05T09:00:00", "timezone": zone}
        assert client.post(f"{base}/messages", json=message,
                           headers=auth).status_code == 400, zone
        batch = client.post(f"{base}/messages:batch", json={"messages": [message]},
                            headers=auth).get_json()
        assert batch["results"][0]["status"] == 400, zone


def test_links_lead_to_every_operation_on_something_created(app: Flask) -> None:
    """The document's links are valid (schemathesis builds its state machine from them, which
    fails on a link to no operation or to a parameter it does not take), and every operation
    on a message, campaign, schedule or operation has one leading to it, from the calls that
    create or list them."""
    schema = schemathesis.openapi.from_wsgi("/openapi.yaml", app)
    schema.as_state_machine()  # raises on an invalid link
    spec = app.test_client().get("/openapi.json").get_json()
    targets = {link["operationRef"] for ops in spec["paths"].values()
               for op in ops.values() if isinstance(op, dict)
               for response in op.get("responses", {}).values()
               for link in response.get("links", {}).values()}
    for path, ops in spec["paths"].items():
        if not any(p in path for p in ("{message_id}", "{campaign}", "{name}", "{op_id}")):
            continue
        for method in set(ops) - {"parameters"}:
            ref = "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method
            assert ref in targets, f"no link leads to {method.upper()} {path}"
