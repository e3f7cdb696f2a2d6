"""The short form of `make faults` (tests/faults/run.py): every nemesis of the `solo` node
once, on a small workload, against a stack of its own processes. Every promise the checker
judges must hold in every round: nothing lost, nothing unexpected, nothing early, nothing
handed out after an acknowledged cancel or a pull ack. The cluster nemesis (a node of the
local 3-node cluster killed) runs in `make faults`; tests/test_cluster.py checks the cluster
itself in the suite."""

from __future__ import annotations

import pytest

from tests.faults import checker
from tests.faults.run import CLUSTER_NEMESES, NEMESES, run, table

pytestmark = pytest.mark.outage  # it kills and restarts the solo node


def test_every_promise_holds_under_each_nemesis() -> None:
    solo = [name for name in NEMESES if name not in CLUSTER_NEMESES]
    rows = run(solo, messages=200, window_s=6)
    print(table(rows))
    assert [r["nemesis"] for r in rows] == solo
    for row in rows:
        assert row["accepted"] > 150, row  # the round did run
        broken = {k: row[k] for k in checker.MUST_BE_ZERO if row[k]}
        assert not broken, (row["nemesis"], broken, row["examples"], row.get("lost_states"))
