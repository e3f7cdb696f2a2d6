"""`make bench` (the command line's start): wall time of `duetime --help` and of
`duetime stats TOPIC` against the running stack (`make up`), RUNS times each, p50/p99/max
(ms), beside the floor of the same run: the interpreter starting and importing urllib3, the
least any Python command using the client can cost. The ratio to it is the figure that
travels between machines. Writes bench-results/cli_start.json.
Usage: python -m tests.bench.cli_start [RUNS=20]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.bench.run import URL, dev_headers, make_topic, percentile, report

DUETIME = Path(sys.executable).parent / "duetime"


def _timed(argv: list[str], runs: int) -> dict[str, float]:
    """p50/p99/max ms of running argv to its end, runs times; each run must exit 0."""
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        took.append((time.perf_counter() - began) * 1000)
    return {"p50": round(percentile(took, 0.5), 1), "p99": round(percentile(took, 0.99), 1),
            "max": round(max(took), 1)}


def main(argv: list[str]) -> int:
    runs = int(argv[1]) if len(argv) > 1 else 20
    headers = dev_headers()
    topic = make_topic(headers)
    key = headers["Authorization"].split()[1]
    floor = _timed([sys.executable, "-c", "import urllib3"], runs)
    helped = _timed([str(DUETIME), "--help"], runs)
    stats = _timed([str(DUETIME), "stats", topic, "--url", URL, "--key", key], runs)
    report("cli_start.json", {
        "runs": runs, "python_import_urllib3_ms": floor, "duetime_help_ms": helped,
        "duetime_stats_ms": stats,
        "help_vs_floor_p50": round(helped["p50"] / floor["p50"], 2),
        "stats_vs_floor_p50": round(stats["p50"] / floor["p50"], 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
