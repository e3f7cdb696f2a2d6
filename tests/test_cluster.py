"""The local 3-node cluster: all nodes UN, and RF=3 QUORUM writes survive one killed node."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
    Unavailable,
    WriteTimeout,
)
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import RoundRobinPolicy
from cassandra.query import SimpleStatement

from tests.conftest import devstack

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    devstack("start", "cluster")
    yield
    devstack("stop", "cluster", check=False)


def _up_normal(status_output: str) -> set[str]:
    return set(re.findall(r"^UN\s+(127\.0\.0\.\d)", status_output, flags=re.MULTILINE))


def _wait_up_normal(ip: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ip in _up_normal(devstack("nodetool", "c1", "status").stdout):
            return True
        time.sleep(1)
    return False


def _every_node_answers(session: Any, query: str, rows: int, within_s: float = 60) -> None:
    """Wait until each of the three nodes, asked itself, returns at least `rows` rows of
    `query`. The driver's schema agreement reads the other nodes' schema versions from one
    node's gossip, which may still be the version before a DDL another node just ran: the
    DDL is then "agreed" while the other nodes do not know it yet."""
    deadline = time.monotonic() + within_s
    while True:
        hosts = [h for h in session.cluster.metadata.all_hosts() if h.is_up]
        short = [h.address for h in hosts if _rows_of(session, query, h) < rows]
        if len(hosts) == 3 and not short:
            return
        assert time.monotonic() < deadline, (
            f"after {within_s} s, {len(hosts)} nodes up, short of {rows} rows of "
            f"{query!r}: {short}")
        time.sleep(1)


def _rows_of(session: Any, query: str, host: Any) -> int:
    """How many rows `host` itself returns for `query`; 0 when it does not answer (three
    JVMs on two busy cores: the driver may mark a node down for a moment, once between the
    check that it was up and the query)."""
    try:
        return len(list(session.execute(query, host=host)))
    except (NoHostAvailable, OperationTimedOut):
        return 0


def _until_every_node_knows(session: Any, ddl: str, check: str, within_s: float = 60) -> None:
    """Run an idempotent DDL until it applies, then wait until every node answers `check`
    (a query of system_schema) with a row. A node of a cluster started a moment ago may not
    know yet the keyspace the DDL builds on (app.store.migrations retries a DDL so too)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            session.execute(ddl)
            break
        except InvalidRequest as exc:
            if "exist" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(1)
    _every_node_answers(session, check, 1, max(1.0, deadline - time.monotonic()))


def test_three_nodes_up_normal_and_quorum_survives_one_kill(cluster: None) -> None:
    status = devstack("nodetool", "c1", "status").stdout
    assert _up_normal(status) == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}, status

    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy())
    # DDL waits until every node has the new schema (the driver gives up after 10 s by
    # default, which three JVMs on two busy cores can exceed; then the first write may reach
    # a node that does not know the table yet).
    driver = Cluster(["127.0.0.1", "127.0.0.2"], port=9043, protocol_version=5,
                     execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                     max_schema_agreement_wait=120)
    session = driver.connect()
    try:
        # each node knows the other two before a keyspace of RF 3 is made (once, a node that
        # did not know them yet made it alone: "replication factor 3 ... higher than the
        # number of nodes 1", and the writes then found no keyspace on the others)
        _every_node_answers(session, "SELECT peer FROM system.peers", 2)
        _until_every_node_knows(
            session, "CREATE KEYSPACE IF NOT EXISTS faults WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = 'faults'")
        _until_every_node_knows(
            session, "CREATE TABLE IF NOT EXISTS faults.kv (k int PRIMARY KEY, v text)",
            "SELECT table_name FROM system_schema.tables "
            "WHERE keyspace_name = 'faults' AND table_name = 'kv'")
        devstack("kill", "c3")
        write = SimpleStatement("INSERT INTO faults.kv (k, v) VALUES (%s, %s)",
                                consistency_level=ConsistencyLevel.QUORUM)
        for k in range(50):
            session.execute(write, (k, f"v{k}"))
        # Single-partition reads (speculative retry covers a replica not yet marked down);
        # a range count(*) has no such retry and may time out while gossip catches up.
        read = SimpleStatement("SELECT v FROM faults.kv WHERE k = %s",
                               consistency_level=ConsistencyLevel.QUORUM)
        assert [session.execute(read, (k,)).one().v for k in range(50)] == [
            f"v{k}" for k in range(50)]
        all_nodes = SimpleStatement("INSERT INTO faults.kv (k, v) VALUES (1, 'x')",
                                    consistency_level=ConsistencyLevel.ALL)
        # ALL cannot be met with a replica dead: Unavailable once gossip knows, timeout before.
        with pytest.raises((Unavailable, WriteTimeout)):
            session.execute(all_nodes)
        devstack("start", "c3")
        assert _wait_up_normal("127.0.0.3", within_s=60)
    finally:
        driver.shutdown()
