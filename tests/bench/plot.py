"""Charts of the benchmarks (matplotlib, from the `spark` extra; skipped without it): what a
table of per-second figures says, at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def lag_by_second(path: Path, title: str, rows: list[dict[str, Any]]) -> Path | None:
    """Messages due per second (bars) and their lag p50 / p99 / max in ms (lines, log scale);
    None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    seconds = [r["second"] for r in rows]
    fig, lag_axis = plt.subplots(figsize=(9, 4))
    count_axis = lag_axis.twinx()
    count_axis.bar(seconds, [r["messages"] for r in rows], color="#d9d9d9", width=0.8,
                   label="messages due")
    count_axis.set_ylabel("messages due in that second")
    for key, color in (("p50", "#2e8b57"), ("p99", "#3b73b9"), ("max", "#c0392b")):
        lag_axis.plot(seconds, [max(1, r[key]) for r in rows], marker="o", color=color,
                      label=f"lag {key}")
    lag_axis.set_yscale("log")
    lag_axis.set_ylabel("lag, ms (receive time - deliver_at)")
    lag_axis.set_xlabel("second of due time since the first message")
    lag_axis.set_zorder(count_axis.get_zorder() + 1)
    lag_axis.patch.set_visible(False)
    lag_axis.legend(loc="upper left")
    lag_axis.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
