"""The report's pictures and page: PNG charts (matplotlib, no display needed) and one HTML
file that shows them with the numbers. Pure: data in, files out."""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend must be chosen first


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def bar_chart(path: Path, title: str, labels: list[str], values: list[float],
              ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(labels, values, color="#3b73b9")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=30)
    return _save(fig, path)


def load_chart(path: Path, title: str, per_slot: list[tuple[str, int]], slot_ms: int) -> str:
    """Scheduled messages per time slot (its start, RFC 3339 → count; slot_ms long)."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    if per_slot:
        xs = [dt.datetime.fromisoformat(s) for s, _ in per_slot]
        # matplotlib's date converter takes datetimes; its stubs list numbers only
        ax.bar(xs, [n for _, n in per_slot], width=slot_ms / 86_400_000 * 0.9,  # type: ignore[arg-type]
               color="#2e8b57")
    ax.set_title(title)
    ax.set_ylabel("messages")
    ax.set_xlabel("UTC")
    fig.autofmt_xdate()
    return _save(fig, path)


def lag_chart(path: Path, rows: list[dict[str, Any]]) -> str:
    """Delivery lag p50/p90/p99 (ms) per campaign."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [r["campaign"] for r in rows]
    width = 0.27
    for i, q in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax.bar([x + (i - 1) * width for x in range(len(names))], [r[q] for r in rows],
               width, label=q.removesuffix("_ms"))
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_ylabel("lag (ms)")
    ax.set_title("Delivery lag per campaign (receive - deliver_at)")
    ax.legend()
    return _save(fig, path)


FUNNEL_PANELS = 4  # the largest campaigns get a panel each
FUNNEL_LINES = {"entered": "#3b73b9", "delivered": "#2e8b57", "dead": "#b22222",
                "cancelled": "#999999"}


def funnel_chart(path: Path, rows: list[dict[str, Any]], slot_ms: int) -> str | None:
    """Per campaign (the largest FUNNEL_PANELS), cumulative messages entered and ended
    delivered, dead or cancelled over time: the gap between the first line and the others
    is what is still scheduled or leased."""
    per_campaign: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per_campaign.setdefault(r["campaign"], []).append(r)
    largest = sorted(per_campaign, key=lambda c: -sum(r["entered"] for r in per_campaign[c]))
    if not largest:
        return None
    shown = largest[:FUNNEL_PANELS]
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for ax, name in zip(axes[:, 0], shown, strict=True):
        points = sorted(per_campaign[name], key=lambda r: r["starts_at"])
        # from a slot before the first (nothing yet) to a slot after the last (all of it), so
        # a campaign that fits in one minute still shows its rise
        starts = [dt.datetime.fromisoformat(r["starts_at"]) for r in points]
        slot = dt.timedelta(milliseconds=slot_ms)
        xs = [starts[0] - slot, *starts, starts[-1] + slot]
        for key, color in FUNNEL_LINES.items():
            running, ys = 0, [0]
            for r in points:
                running += r[key]
                ys.append(running)
            ax.step(xs, [*ys, running], where="post", label=key, color=color, marker=".")
        ax.set_xlim(xs[0], xs[-1])
        ax.set_title(f"Campaign {name}")
        ax.set_ylabel("messages")
        ax.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    return _save(fig, path)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values())
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(path: Path, title: str, sections: list[tuple[str, str | None, list[dict[str, Any]]]]
         ) -> None:
    """One HTML page: per section a heading, a chart (file name) and the numbers."""
    parts = [f"<h2>{html.escape(name)}</h2>"
             + (f'<img src="{html.escape(image)}" alt="{html.escape(name)}">' if image else "")
             + _table(rows) for name, image, rows in sections]
    path.write_text(
        "<!doctype html><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>"
        f"<h1>{html.escape(title)}</h1>" + "".join(parts), encoding="utf-8")
