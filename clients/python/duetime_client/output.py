"""How the `duetime` commands print answers for people: tables for lists, `field  value`
lines for one object (nulls as `-`), a topic's stats with its load ahead as a table, and an
error answer with the fields it refused."""

from __future__ import annotations

import datetime
import json
from typing import Any

# the columns a table shows first, when its rows have them
FIRST_COLUMNS = ("name", "id", "from", "count", "p50_ms", "p99_ms", "campaign", "state",
                 "deliver_at", "last_error", "cron", "timezone",
                 "max_attempts", "lease_seconds", "paused", "max_per_second")
MAX_COLUMNS = 6


def format_ms(epoch_ms: int) -> str:
    """Epoch ms → RFC 3339 UTC with millisecond precision, e.g. 2026-12-01T09:00:00.250Z."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def human(command: str, answer: Any) -> str:
    """A table for lists of objects, `field  value` lines for one object; `stats` as its
    counts then its upcoming windows."""
    if command == "stats" and isinstance(answer, dict) and "upcoming" in answer:
        return stats(answer)
    if isinstance(answer, list):
        return table(answer)
    width = max((len(k) for k in answer), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in answer.items())


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """Rows as aligned columns (the FIRST_COLUMNS first, at most MAX_COLUMNS of scalars)."""
    if not rows:
        return "(none)"
    if columns is None:
        scalars = {k for row in rows for k, v in row.items() if not isinstance(v, dict | list)}
        columns = sorted(scalars, key=lambda k: (
            FIRST_COLUMNS.index(k) if k in FIRST_COLUMNS else len(FIRST_COLUMNS), k))
        columns = columns[:MAX_COLUMNS]
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[n]) for r in cells)) for n, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def stats(answer: dict[str, Any]) -> str:
    """The counts by state, then the windows ahead that hold scheduled messages."""
    counts = answer.get("counts") or {}
    width = max((len(k) for k in counts), default=0)
    lines = [f"{k.ljust(width)}  {cell(v)}" for k, v in counts.items()]
    ahead = [w for w in answer.get("upcoming") or [] if w.get("count")]
    lines.append("")
    lines.append("upcoming" if ahead else "upcoming  (nothing scheduled in the windows ahead)")
    if ahead:
        lines.append(table(ahead, ["from", "to", "count"]))
    return "\n".join(lines)


def cell(value: Any) -> str:
    """One value as a table shows it: `-` for null, JSON for objects and lists."""
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def problem_text(status: int, problem: dict[str, Any]) -> str:
    """`error STATUS: detail`, then a `  field: message` line for each field the answer's
    problem+json `errors` refused (nested fields joined with dots)."""
    lines = [f"error {status}: {problem.get('detail') or problem.get('title') or ''}".rstrip()]
    lines += [f"  {field}: {message}" for field, message in _field_errors(problem.get("errors"))]
    return "\n".join(lines)


def _field_errors(errors: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(errors, dict):
        found = []
        for key, value in errors.items():
            found += _field_errors(value, f"{prefix}.{key}" if prefix else str(key))
        return found
    if isinstance(errors, list) and all(isinstance(e, str) for e in errors):
        return [(prefix or "request", " ".join(errors))]
    if isinstance(errors, list):
        found = []
        for n, value in enumerate(errors):
            found += _field_errors(value, f"{prefix}.{n}" if prefix else str(n))
        return found
    return [] if errors is None else [(prefix or "request", str(errors))]
