"""The short form of `make faults` (tests/faults/run.py): every nemesis once, on a small
workload, against a stack of its own processes on the `solo` node (and, for the cluster
nemesis, on the local 3-node cluster). Every promise the checker
judges must hold in every round: nothing lost, nothing unexpected, nothing early, nothing
handed out after an acknowledged cancel or a pull ack."""

from __future__ import annotations

import pytest

from tests.faults import checker
from tests.faults.run import NEMESES, run, table

pytestmark = pytest.mark.outage  # it kills and restarts the solo node


def test_every_promise_holds_under_each_nemesis() -> None:
    rows = run(list(NEMESES), messages=200, window_s=6)
    print(table(rows))
    assert [r["nemesis"] for r in rows] == list(NEMESES)
    for row in rows:
        assert row["accepted"] > 150, row  # the round did run
        broken = {k: row[k] for k in checker.MUST_BE_ZERO if row[k]}
        assert not broken, (row["nemesis"], broken, row["examples"], row.get("lost_states"))
