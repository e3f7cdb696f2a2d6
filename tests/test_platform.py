"""The platform: the real Cassandra node, migrations, API keys, liveness and readiness."""

from __future__ import annotations

import pytest
import yaml
from cassandra import InvalidRequest, ReadFailure, WriteFailure
from cassandra.protocol import SyntaxException
from flask.testing import FlaskClient

from app.services import Services
from app.store import migrations
from tests.conftest import ROOT, devstack


def test_node_is_cassandra_5_0(services: Services) -> None:
    version = services.db.execute_raw("SELECT release_version FROM system.local")[0]
    assert version["release_version"].startswith("5.0.")
    assert version["release_version"] == devstack("version").stdout.strip()


def test_schema_apply_twice_is_a_noop(services: Services) -> None:
    assert migrations.apply(services.db) == []
    assert migrations.pending(services.db) == []
    recorded = services.db.execute_raw("SELECT version, checksum FROM {ks}.schema_migrations")
    assert {r["version"]: r["checksum"] for r in recorded} == {
        m.version: m.checksum for m in migrations.discover()
    }


def test_migration_statements_split_and_qualify() -> None:
    first = migrations.discover()[0]
    statements = first.statements()
    assert all(s.upper().startswith("CREATE TABLE IF NOT EXISTS") for s in statements)
    assert migrations._qualify(statements[0], "ks1").startswith(
        "CREATE TABLE IF NOT EXISTS ks1.")


def test_migrations_wait_out_a_schema_not_yet_on_every_node(services: Services) -> None:
    """What migrations try again (for DDL_RETRY_S) and what they raise at once: the node's
    own refusal of a table it does not know, and a replica's INCOMPATIBLE_SCHEMA (a new
    cluster's first read of the table its coordinator just made: seen in `make faults`'
    cluster round) are tried again; a syntax error or another replica failure is not."""
    with pytest.raises(InvalidRequest) as unknown:
        services.db.execute_raw("SELECT version FROM {ks}.no_such_table")
    assert migrations.unsettled(unknown.value)
    with pytest.raises(SyntaxException) as malformed:
        services.db.execute_raw("SELEKT version FROM {ks}.schema_migrations")
    assert not migrations.unsettled(malformed.value)
    seen = ('Error from server: code=1300 [Replica(s) failed to execute read] message="Operation '
            'failed - received 0 responses and 2 failures: INCOMPATIBLE_SCHEMA from '
            '/127.0.0.1:7010, INCOMPATIBLE_SCHEMA from /127.0.0.2:7010"')
    assert migrations.unsettled(ReadFailure(seen))
    assert migrations.unsettled(WriteFailure(seen.replace("read", "write")))
    assert not migrations.unsettled(ReadFailure(seen.replace("INCOMPATIBLE_SCHEMA",
                                                             "READ_TOO_MANY_TOMBSTONES")))


def test_key_authenticates_its_tenant(client: FlaskClient, services: Services) -> None:
    key = services.keys.create("acme")
    assert services.keys.tenant_of(key) == "acme"
    answer = client.get("/v1/topics", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200


def test_keys_are_stored_hashed(services: Services) -> None:
    key = services.keys.create("hashcheck")
    rows = services.db.execute_raw("SELECT key_hash FROM {ks}.api_keys")
    assert all(key not in r["key_hash"] for r in rows)


def test_wrong_or_missing_key_gets_401_problem(client: FlaskClient) -> None:
    for headers in ({"Authorization": "Bearer dt_nope"}, {}, {"Authorization": "Basic x"}):
        answer = client.get("/v1/topics", headers=headers)
        assert answer.status_code == 401
        assert answer.content_type == "application/problem+json"
        body = answer.get_json()
        assert body["status"] == 401 and body["title"] and body["detail"]


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["schema_version"] == max(m.version for m in migrations.discover())


def test_unknown_route_is_problem_json(client: FlaskClient) -> None:
    answer = client.get("/no/such/thing")
    assert answer.status_code == 404
    assert answer.content_type == "application/problem+json"


def test_a_method_a_route_does_not_take_gets_405_naming_those_it_does(
        client: FlaskClient) -> None:
    """RFC 9110: a 405 carries Allow (a fuzzer's TRACE found it missing)."""
    for method, path, allowed in (("TRACE", "/healthz", {"GET", "HEAD", "OPTIONS"}),
                                  ("DELETE", "/readyz", {"GET", "HEAD", "OPTIONS"})):
        answer = client.open(path, method=method)
        assert answer.status_code == 405, (method, path)
        assert answer.content_type == "application/problem+json"
        assert {m.strip() for m in answer.headers["Allow"].split(",")} == allowed, (
            method, path, answer.headers.get("Allow"))


def test_bodies_the_spec_calls_optional_may_be_left_out(
        client: FlaskClient, auth: dict[str, str]) -> None:
    """Every field of these bodies has a default, and openapi.yaml says so (requestBody not
    required): a call without one gets the defaults."""
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    for path, method in (("/v1/topics/{topic}", "put"), ("/v1/topics/{topic}/leases", "post"),
                         ("/v1/topics/{topic}/signing-secret:rotate", "post")):
        assert spec["paths"][path][method]["requestBody"]["required"] is False, path
    made = client.put("/v1/topics/bodiless", headers=auth)
    assert made.status_code == 201 and made.get_json()["lease_seconds"] == 30
    leased = client.post("/v1/topics/bodiless/leases", headers=auth)
    assert leased.status_code == 200 and leased.get_json() == {"messages": []}
