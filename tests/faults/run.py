"""`make faults`: duetime's promises under faults, one nemesis per round, then all combined.

Each round runs the workload of tests/faults/workload.py against the fault stack
(tests/faults/stack.py: gunicorn, two releasers, the `solo` node), strikes its nemesis a
third of the way into the window, waits until every accepted message is settled (or
DRAIN_S passes) and judges the round's history with tests/faults/checker.py. Prints a table
and writes bench-results/faults.json and bench-results/faults.md.

Usage: python -m tests.faults.run [MESSAGES per round = 2000] [WINDOW_S = 30] [NEMESIS ...]
(`make faults` runs the long form; the suite's tests/test_faults.py a short one.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.faults import checker
from tests.faults.stack import LEASE_MS, NODE, FaultStack, _signal, devstack
from tests.faults.workload import History, Workload, new_receiver
from tests.receiver import Receiver, receiving

DRAIN_S = 90
SETTLE_READS = 20  # messages still undelivered whose state a drain check reads
OUT = Path("bench-results")
Strike = Callable[[FaultStack, Receiver], None]


def _kill_api_worker(stack: FaultStack, target: Receiver) -> None:
    """SIGKILL a gunicorn worker (its master starts another); again 3 s later."""
    for _ in range(2):
        _signal(stack.api_workers()[0], signal.SIGKILL)
        time.sleep(3)


def _kill_releaser(stack: FaultStack, target: Receiver) -> None:
    """SIGKILL a releaser and its POST process; a new one starts 3 s later."""
    stack.kill_releaser("faults-r1")
    time.sleep(3)
    stack.start_releaser("faults-r1")


def _kill_post_process(stack: FaultStack, target: Receiver) -> None:
    """SIGKILL the webhook POST process of both releasers (each restarts its own)."""
    for member in list(stack.releasers):
        for pid in stack.post_processes(member):
            _signal(pid, signal.SIGKILL)


def _pause_releaser(stack: FaultStack, target: Receiver) -> None:
    """SIGSTOP a releaser for twice its slot lease, then SIGCONT: the other takes its slots
    meanwhile, and on waking it must not deliver from slots it no longer owns."""
    pid = stack.releasers["faults-r1"].pid
    _signal(pid, signal.SIGSTOP)
    time.sleep(2 * LEASE_MS / 1000)
    _signal(pid, signal.SIGCONT)


def _restart_node(stack: FaultStack, target: Receiver) -> None:
    """kill -9 of the Cassandra node, started again at once: every process must ride it out."""
    devstack("kill", NODE)
    devstack("start", NODE)


def _kill_cluster_node(stack: FaultStack, target: Receiver) -> None:
    """kill -9 of one node of the three (RF=3, QUORUM): the two left carry on; it is started
    again 10 s later and catches up (hints, then reads repair what they meet)."""
    devstack("kill", "c2")
    time.sleep(10)
    devstack("start", "c2")


def _clock(offset_ms: int) -> Strike:
    def strike(stack: FaultStack, target: Receiver) -> None:
        """A releaser restarted with its clock moved (DUETIME_CLOCK_OFFSET_MS)."""
        stack.kill_releaser("faults-r1")
        stack.start_releaser("faults-r1", DUETIME_CLOCK_OFFSET_MS=str(offset_ms))
    return strike


def _target_down(stack: FaultStack, target: Receiver) -> None:
    """The webhook target holds every request for 8 s (past the topic's 5 s timeout)."""
    gate = threading.Event()
    target.gate = gate
    time.sleep(8)
    target.gate = None
    gate.set()


def _heal_clock(stack: FaultStack) -> None:
    stack.kill_releaser("faults-r1")
    stack.start_releaser("faults-r1")


def _combined(stack: FaultStack, target: Receiver) -> None:
    """A worker killed, a releaser paused, the target down, the node restarted, in turn."""
    _kill_api_worker(stack, target)
    _pause_releaser(stack, target)
    _target_down(stack, target)
    _restart_node(stack, target)


# name -> (strike, allowed early ms: the clock offset it injects); the nemeses of the
# 3-node cluster run on a stack of their own (CLUSTER_NEMESES)
NEMESES: dict[str, tuple[Strike | None, int]] = {
    "none": (None, 0),
    "kill-api-worker": (_kill_api_worker, 0),
    "kill-releaser": (_kill_releaser, 0),
    "kill-post-process": (_kill_post_process, 0),
    "pause-releaser": (_pause_releaser, 0),
    "restart-node": (_restart_node, 0),
    "clock-ahead-500ms": (_clock(500), 500),
    "clock-behind-500ms": (_clock(-500), 0),
    "target-down": (_target_down, 0),
    "combined": (_combined, 0),
    "cluster-kill-node": (_kill_cluster_node, 0),
}
CLUSTER_NEMESES = ("cluster-kill-node",)


def run_round(stack: FaultStack, target: Receiver, name: str, messages: int,
              window_s: float, saved_as: str | None = None) -> dict[str, Any]:
    """One round under nemesis `name`; its history is saved as
    bench-results/faults-history-{saved_as or name}.jsonl."""
    strike, allowed_early = NEMESES[name]
    history = History()
    workload = Workload(stack.url, stack.key, history, target, f"r{int(time.time())}-{name}",
                        messages, int(window_s * 1000))
    workload.create_topics(target.url)
    workload.start_consumers()
    producing = threading.Thread(target=workload.run, daemon=True)
    producing.start()
    if strike is not None:
        time.sleep(1 + window_s / 3)
        strike(stack, target)
    producing.join()
    deadline = time.monotonic() + window_s + DRAIN_S
    while time.monotonic() < deadline and not _settled(workload, history):
        time.sleep(2)
    workload.stop_consumers()
    if name.startswith("clock"):
        _heal_clock(stack)
    workload.record_arrivals(history)
    OUT.mkdir(exist_ok=True)
    with (OUT / f"faults-history-{saved_as or name}.jsonl").open("w") as out:
        for event in history.of_all():
            out.write(json.dumps(dataclasses.asdict(event)) + "\n")
    suspects = checker.check(history)["all_lost"]
    states = {i: workload.state_of(i) for i in suspects}  # an unanswered ack may have applied
    result = checker.check(history, allowed_early,
                           {i: str(s.get("state")) for i, s in states.items() if s})
    result["lost_states"] = [states[i] for i in result["all_lost"]]
    return {"nemesis": name, **result}


def _settled(workload: Workload, history: History) -> bool:
    """Every message accepted and not cancelled has been delivered (so far; the state of a
    few left is read, for acks that got no answer)."""
    snapshot = History()
    snapshot.events = history.of_all()
    workload.record_arrivals(snapshot)
    left = checker.check(snapshot)["all_lost"]
    if not left or len(left) > SETTLE_READS:
        return not left
    # no patience here: a 503 leaves the message unsettled for now, and the drain loop,
    # bounded by its deadline, asks again
    states = {i: str((workload.state_of(i, patience_s=0) or {}).get("state")) for i in left}
    return bool(checker.check(snapshot, states=states)["lost"] == 0)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| nemesis | accepted | cancelled | delivered | lost | unexpected | early | "
            "after cancel | handed out after ack | dead without a hand-out | duplicates | "
            "webhook repeats after 200 | "
            "first seen on a later attempt | enqueued late | "
            "lag p50 / p99 / max ms: all; pull; "
            "pull, duetime's wait; webhook |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lags = "; ".join(_spread(lag) for lag in (r["lag_ms"], *(
            r["lag_ms_by"][mode] for mode in ("pull", "pull_wait", "webhook"))))
        lines.append(
            f"| {r['nemesis']} | {r['accepted']} | {r['cancelled']} | {r['delivered']} | "
            f"{r['lost']} | {r['unexpected']} | {r['early']} | {r['after_cancel']} | "
            f"{r['handed_out_after_ack']} | {r['dead_without_handout']} | {r['duplicates']} | "
            f"{r['webhook_repeats_after_200']} | {r['first_seen_later']} | "
            f"{r['enqueued_late']} | {lags} |")
    return "\n".join(lines)


def _spread(lag: dict[str, int]) -> str:
    return f"{lag['p50']} / {lag['p99']} / {lag['max']}"


def run(names: list[str], messages: int, window_s: float) -> list[dict[str, Any]]:
    """Each nemesis of `names` in turn, those of the solo node first, then those of the
    3-node cluster on a stack of their own."""
    rows = []
    for cluster in (False, True):
        chosen = [n for n in names if (n in CLUSTER_NEMESES) == cluster]
        if chosen:
            rows += _run_on(FaultStack(cluster=cluster), chosen, messages, window_s)
    return rows


def _run_on(stack: FaultStack, names: list[str], messages: int,
            window_s: float) -> list[dict[str, Any]]:
    rows = []
    with receiving(new_receiver()) as target:
        stack.start()
        try:
            # warm-up (a cold node's first seconds), saved apart from the "none" round's
            run_round(stack, target, "none", 50, 3,
                      saved_as="warm-up-cluster" if stack.cluster else "warm-up")
            for name in names:
                row = run_round(stack, target, name, messages, window_s)
                print(json.dumps({k: row[k] for k in ("nemesis", "ok", "lost", "early",
                                                       "lag_ms")}), flush=True)
                rows.append(row)
        finally:
            if os.environ.get("DUETIME_FAULTS_KEEP"):
                print(f"the fault stack keeps running: {stack.url}, logs in {stack.run_dir}")
            else:
                stack.stop()
    return rows


def main(argv: list[str]) -> int:
    messages = int(argv[0]) if argv else 2000
    window_s = float(argv[1]) if len(argv) > 1 else 30
    names = argv[2:] or list(NEMESES)
    rows = run(names, messages, window_s)
    OUT.mkdir(exist_ok=True)
    (OUT / "faults.json").write_text(json.dumps(rows, indent=2))
    (OUT / "faults.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
