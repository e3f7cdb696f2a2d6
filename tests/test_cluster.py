"""The local 3-node cluster: all nodes UN, and RF=3 QUORUM writes survive one killed node."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, Unavailable, WriteTimeout
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
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


def _until_every_node_knows(session: Any, ddl: str, within_s: float = 60) -> None:
    """Run an idempotent DDL until it applies with the schema agreed. A node of a cluster
    started a moment ago may not know yet the keyspace the DDL builds on, even after the
    one before was agreed by the nodes the driver saw (app.store.migrations does the same)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if session.execute(ddl).response_future.is_schema_agreed:
                return
        except InvalidRequest as exc:
            if "exist" not in str(exc) or time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, f"schema never agreed: {ddl}"
        time.sleep(1)


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
        for ddl in ("CREATE KEYSPACE IF NOT EXISTS faults WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 3}",
                    "CREATE TABLE IF NOT EXISTS faults.kv (k int PRIMARY KEY, v text)"):
            _until_every_node_knows(session, ddl)
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
