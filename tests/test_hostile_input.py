"""Input JSON parses but duetime cannot carry, on the real node: integers past Python's 4,300
digits, lone UTF-16 surrogates, NaN and Infinity, instants outside years 1-9999, time
spellings RFC 3339 does not have, bodies not declared JSON. Each is a 400 (415) problem
naming its place, never a 500; a property test sends them to every route with a body."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import create_app
from app.config import Config
from app.core.timeparse import MAX_MS, MIN_MS
from tests.conftest import new_tenant_key
from tests.consumers import TopicClient

HUGE = "7" * 4301
HOLE = '"\\ud800"'  # a lone surrogate, as JSON escapes it


def _post(client: FlaskClient, url: str, text: str, auth: dict[str, str],
          method: str = "POST") -> Any:
    return client.open(url, method=method, data=text, headers=auth,
                       content_type="application/json")


def _problem(answer: Any, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, answer.get_data(as_text=True)
    assert answer.content_type == "application/problem+json"
    body: dict[str, Any] = answer.get_json()
    return body


@pytest.mark.parametrize("text, errors", [
    (f'{{"payload": {HUGE}}}', {"payload": ["An integer of too many digits."]}),
    (f'{{"payload": -{HUGE}}}', {"payload": ["An integer of too many digits."]}),
    (f'{{"payload": 1, "priority": {HUGE}}}', {"priority": ["An integer of too many digits."]}),
    (f'{{"payload": 1, "delay_ms": {HUGE}}}', {"delay_ms": ["An integer of too many digits."]}),
    (f'{{"payload": 1, "deliver_at": {HUGE}}}',
     {"deliver_at": ["An integer of too many digits."]}),
    (f'{{"payload": {HOLE}}}', {"payload": ["A lone UTF-16 surrogate, which is not text."]}),
    (f'{{"payload": 1, "headers": {{"x": {HOLE}}}}}',
     {"headers": {"x": ["A lone UTF-16 surrogate, which is not text."]}}),
    ('{"payload": {"v": NaN, "w": 1e999, "x": -Infinity}}',
     {"payload": {"v": ["NaN is not a number JSON carries."],
                  "w": ["Out of range for a number."],
                  "x": ["-Infinity is not a number JSON carries."]}}),
], ids=["int", "negative-int", "priority", "delay_ms", "deliver_at", "surrogate", "header",
        "nan-infinity"])
def test_what_json_parses_but_duetime_cannot_carry_is_a_400_naming_it(
        client: FlaskClient, auth: dict[str, str], text: str, errors: dict[str, Any]) -> None:
    topic = TopicClient(client, auth)
    assert _problem(_post(client, topic.url("/messages"), text, auth))["errors"] == errors


def test_a_batch_names_the_item_and_a_pair_of_surrogates_is_text(
        client: FlaskClient, auth: dict[str, str]) -> None:
    topic = TopicClient(client, auth)
    text = f'{{"messages": [{{"payload": 1}}, {{"payload": 1, "priority": {HUGE}}}]}}'
    assert _problem(_post(client, topic.url("/messages:batch"), text, auth))["errors"] == {
        "messages": {"1": {"priority": ["An integer of too many digits."]}}}
    emoji = _post(client, topic.url("/messages"), '{"id": "e", "payload": "\\ud83d\\ude00"}',
                  auth)
    assert emoji.status_code == 201, emoji.get_json()
    assert topic.get("e").get_json()["payload"] == "\U0001F600"


@pytest.mark.parametrize("route, text, field", [
    ("/leases", f'{{"max": {HUGE}}}', "max"),
    ("/leases", f'{{"wait_ms": {HUGE}}}', "wait_ms"),
    ("/leases", f'{{"lease_seconds": {HUGE}}}', "lease_seconds"),
    ("/leases", '{"max": NaN}', "max"),
    ("/campaigns/c1", f'{{"shift_ms": {HUGE}}}', "shift_ms"),
    ("/schedules/s1", f'{{"cron": "* * * * *", "payload": {HOLE}}}', "payload"),
    ("/schedules/s1", f'{{"cron": "* * * * *", "payload": {HUGE}}}', "payload"),
    ("/schedules/s1", '{"cron": "* * * * *", "payload": 1, "start_at": -62135596800001}',
     "start_at"),
    ("/schedules/s1", '{"cron": "* * * * *", "payload": 1, "end_at": "2026-W49-7T22:00:00Z"}',
     "end_at"),
], ids=["max", "wait_ms", "lease_seconds", "max-nan", "shift_ms", "schedule-surrogate",
        "schedule-int", "start_at", "end_at"])
def test_every_route_names_the_field_it_refuses(
        client: FlaskClient, auth: dict[str, str], route: str, text: str, field: str) -> None:
    topic = TopicClient(client, auth)
    method = "PUT" if route.startswith("/schedules") else (
        "PATCH" if route.startswith("/campaigns") else "POST")
    answer = _post(client, topic.url(route), text, auth, method)
    assert field in _problem(answer)["errors"], answer.get_json()


@pytest.mark.parametrize("deliver_at", [
    -62135596800001, -9223372036854775809, 253402300800000, 10**30,
    "0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59.999-00:01",
    "2026-W49-7T22:00:00Z", "20261206T220000Z", "2026-12-06 22:00:00Z", "2026-12-06T22:00Z",
    "2026-12-06T22:00:00+0200", "2026-12-06T22:00:00", "2026-340T22:00:00Z",
    "2026-12-06T22:00:00.Z", "\uff12\uff10\uff12\uff16-12-06T22:00:00Z",
])
def test_deliver_at_takes_only_rfc_3339_with_an_offset_or_epoch_ms_of_years_1_to_9999(
        client: FlaskClient, auth: dict[str, str], deliver_at: Any) -> None:
    topic = TopicClient(client, auth)
    answer = topic.enqueue(deliver_at=deliver_at)
    assert "deliver_at" in _problem(answer)["errors"]
    again = client.patch(topic.url("/messages/nope"), json={"deliver_at": deliver_at},
                         headers=auth)
    assert "deliver_at" in _problem(again)["errors"]


@pytest.mark.parametrize(("text", "taken"), [
    ("0001-01-01T00:00:00+01:00", False), ("0001-01-01T05:00:00+01:00", False),
    ("9999-12-31T23:00:00-01:00", False), ("9999-12-31T01:00:00-05:30", False),
    ("0001-01-01T00:00:00-01:00", True), ("9999-12-31T23:00:00+01:00", True),
    ("0001-01-01T00:00:00Z", True), ("9999-12-31T23:59:59.999-00:00", True),
])
def test_the_schemas_time_pattern_and_the_server_agree_at_the_calendars_ends(
        client: FlaskClient, auth: dict[str, str], text: str, taken: bool) -> None:
    """On 0001-01-01 a time ahead of UTC, and on 9999-12-31 one behind it, is refused by
    the schema's pattern (it may name an instant outside years 1 to 9999) and by the server
    alike; the same days in UTC or with the other sign are taken by both."""
    schedule = yaml.safe_load((Path(__file__).parent.parent / "openapi.yaml").read_text())[
        "components"]["schemas"]["SchedulePut"]["properties"]
    for field in ("start_at", "end_at"):
        assert (re.fullmatch(schedule[field]["pattern"], text) is not None) is taken
    topic = TopicClient(client, auth)
    answer = client.put(topic.url("/schedules/edge"), headers=auth, json={
        "cron": "0 3 * * *", "payload": 1, "end_at": text})
    assert (answer.status_code in (200, 201)) is taken, answer.get_json()
    assert (topic.enqueue(deliver_at=text).status_code == 201) is taken


@pytest.mark.parametrize("deliver_at, expected", [
    ("2026-12-01T09:00:00.250Z", "2026-12-01T09:00:00.250Z"),
    ("2026-12-01t11:00:00.250+02:00", "2026-12-01T09:00:00.250Z"),
    ("2026-12-01T09:00:00z", "2026-12-01T09:00:00.000Z"),
    (1796115600250, "2026-12-01T09:00:00.250Z"),
])
def test_the_contracts_spellings_are_taken(client: FlaskClient, auth: dict[str, str],
                                           deliver_at: Any, expected: str) -> None:
    topic = TopicClient(client, auth)
    answer = topic.enqueue(deliver_at=deliver_at)
    assert answer.status_code == 201, answer.get_json()
    assert answer.get_json()["deliver_at"] == expected


@pytest.mark.parametrize("local_time, zone", [
    ("2026-W49-7T22:00:00", "UTC"), ("20261206T220000", "UTC"), ("2026-12-06 22:00:00", "UTC"),
    ("2026-12-06T22:00", "UTC"), ("2026-12-06T22:00:00Z", "UTC"), ("2026-02-30T22:00:00", "UTC"),
    ("0001-01-01T00:00:00", "Asia/Tokyo"), ("9999-12-31T23:59:59", "America/New_York"),
])
def test_local_time_takes_only_a_wall_time_without_offset_within_years_1_to_9999(
        client: FlaskClient, auth: dict[str, str], local_time: str, zone: str) -> None:
    topic = TopicClient(client, auth)
    answer = topic.enqueue(local_time=local_time, timezone=zone)
    assert "local_time" in _problem(answer)["errors"]
    taken = topic.enqueue(local_time="2026-12-06t22:00:00.5", timezone="Europe/Bucharest")
    assert taken.get_json()["deliver_at"] == "2026-12-06T20:00:00.500Z"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_declared_json_is_415(client: FlaskClient, auth: dict[str, str],
                                         content_type: str | None) -> None:
    topic = TopicClient(client, auth)
    headers = {**auth, **({"Content-Type": content_type} if content_type else {})}
    for route in ("/messages", "/messages:batch", "/leases"):
        answer = client.post(topic.url(route), data='{"payload": 1}', headers=headers)
        assert _problem(answer, 415)["errors"] == {"Content-Type": ["Must be application/json."]}
    assert topic.get("x").status_code == 404
    assert client.post(topic.url("/leases"), headers=auth).status_code == 200  # no body at all


def test_the_document_names_415_on_every_route_with_a_body() -> None:
    spec = yaml.safe_load((Path(__file__).parent.parent / "openapi.yaml").read_text())
    with_body = [(path, method) for path, item in spec["paths"].items()
                 for method, op in item.items()
                 if isinstance(op, dict) and "requestBody" in op]
    assert len(with_body) >= 10
    for path, method in with_body:
        assert "415" in spec["paths"][path][method]["responses"], (method, path)


# The property: every route with a body, a hostile value in any of its fields (or inside
# one, or inside a batch's item or a message's headers), never a 5xx, always JSON.
_SPEC = yaml.safe_load((Path(__file__).parent.parent / "openapi.yaml").read_text())
_MARK = "\u0000hostile\u0000"


def _properties(schema: dict[str, Any]) -> list[str]:
    if "$ref" in schema:
        schema = _SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return sorted(schema.get("properties", {}))


_MESSAGE_FIELDS = _properties({"$ref": "#/components/schemas/MessageIn"})
_OPERATIONS = sorted(
    (method.upper(), path, _properties(op["requestBody"]["content"]["application/json"]
                                       ["schema"]))
    for path, item in _SPEC["paths"].items() for method, op in item.items()
    if isinstance(op, dict) and "requestBody" in op)
# bodies that pass the schema, so a hostile value in one field gets past the others
_BASES: dict[str, dict[str, Any]] = {
    "/messages": {"payload": 1, "timezone": "Pacific/Kiritimati"},
    "/messages:batch": {"messages": [{"payload": 1, "timezone": "Pacific/Kiritimati"}]},
    "/schedules/{name}": {"cron": "* * * * *", "payload": 1},
    "/leases": {"max": 1}, "/campaigns/{campaign}": {"shift_ms": 1000},
}

_hostile = st.one_of(
    st.integers(4301, 5000).map(lambda n: "9" * n),
    st.integers(4301, 5000).map(lambda n: "-1" + "0" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "1" + "0" * 400 + ".5"]),
    st.integers(0xD800, 0xDFFF).map(lambda c: f'"\\u{c:04x}"'),
    st.integers(0xD800, 0xDFFF).map(lambda c: f'"x\\u{c:04x}y"'),
    st.one_of(st.integers(max_value=MIN_MS - 1), st.integers(min_value=MAX_MS + 1)).map(str),
    st.sampled_from(["2026-W49-7T22:00:00Z", "20261206T220000Z", "2026-12-06 22:00:00Z",
                     "0000-12-31T23:59:59Z", "0001-01-01T00:00:00+23:59",
                     "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00",
                     "9999-12-31T23:59:59.999"]).map(json.dumps),
)


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(name)
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def hostile_app(config: Config) -> Iterator[tuple[Flask, dict[str, str]]]:
    app = create_app(config)
    auth = new_tenant_key(app.extensions["duetime"], "hostile")[1]
    client = app.test_client()
    assert client.put("/v1/topics/h", json={}, headers=auth).status_code == 201
    client.post("/v1/topics/h/messages", json={"id": "m1", "payload": 1, "campaign": "c1"},
                headers=auth)
    yield app, auth
    app.extensions["duetime"].close()


@given(operation=st.sampled_from(_OPERATIONS), data=st.data(), hostile=_hostile)
@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_route_answers_hostile_input_with_a_5xx(
        hostile_app: tuple[Flask, dict[str, str]], operation: tuple[str, str, list[str]],
        data: st.DataObject, hostile: str) -> None:
    app, auth = hostile_app
    method, path, fields = operation
    suffix = path.removeprefix("/v1/topics/{topic}")
    body = json.loads(json.dumps(_BASES.get(suffix, {})))
    target = body["messages"][0] if suffix == "/messages:batch" else body
    field = data.draw(st.sampled_from(
        (_MESSAGE_FIELDS if suffix == "/messages:batch" else fields) or ["x"]))
    target[field] = data.draw(st.sampled_from([_MARK, {"x": _MARK}, [_MARK]]))
    if data.draw(st.booleans()) and "headers" in (fields + _MESSAGE_FIELDS):
        target["headers"] = {"x": _MARK}
    text = json.dumps(body).replace(json.dumps(_MARK), hostile)
    url = (path.replace("{topic}", "h").replace("{message_id}", "m1")
           .replace("{campaign}", "c1").replace("{name}", "s1").replace("{op_id}", "o1"))
    answer = app.test_client().open(url, method=method, data=text, headers=auth,
                                    content_type="application/json")
    assert answer.status_code < 500, (method, url, text[:200], answer.get_data(as_text=True))
    if answer.status_code >= 400:
        assert answer.content_type == "application/problem+json"
    if answer.get_data():
        _strict(answer.get_data(as_text=True))


# the same, in a query parameter or a path segment of any route
_QUERIED = sorted(
    (method.upper(), path, [p["name"] for p in (op.get("parameters", [])
                                                + item.get("parameters", []))
                            if p["in"] in ("query", "path")])
    for path, item in _SPEC["paths"].items() for method, op in item.items()
    if method in ("get", "put", "post", "patch", "delete"))
_hostile_text = st.one_of(
    st.integers(4301, 5000).map(lambda n: "9" * n),
    st.sampled_from(["NaN", "-Infinity", "1e999", "%ED%A0%80", "%F0%9F", "%00", "%0D%0A",
                     "2026-W49-7T22:00:00Z", "-62135596800001", "18446744073709551616"]))


@given(operation=st.sampled_from(_QUERIED), data=st.data(), hostile=_hostile_text)
@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_query_or_path_answers_hostile_input_with_a_5xx(
        hostile_app: tuple[Flask, dict[str, str]], operation: tuple[str, str, list[str]],
        data: st.DataObject, hostile: str) -> None:
    app, auth = hostile_app
    method, path, names = operation
    values = {"topic": "h", "message_id": "m1", "campaign": "c1", "name": "s1", "op_id": "o1"}
    name = data.draw(st.sampled_from(names or ["x"]))
    values[name] = hostile
    url = path
    for key in ("topic", "message_id", "campaign", "name", "op_id"):
        url = url.replace("{" + key + "}", values[key])
    if name not in values or f"{{{name}}}" not in path:
        url += f"?{name}={hostile}"
    answer = app.test_client().open(url, method=method, headers=auth, json={})
    assert answer.status_code < 500, (method, url[:200], answer.get_data(as_text=True))
    if answer.status_code >= 400:
        assert answer.content_type == "application/problem+json"
