"""Import files for the Spark tests and benchmark: valid rows with, at known places, rows
that must be rejected (missing recipient, bad priority, bad time) and exact repeats."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

HEADER = ["recipient", "title", "deliver_at", "priority"]


@dataclasses.dataclass(frozen=True)
class Expected:
    rows: int
    invalid: int
    duplicates: int

    @property
    def good(self) -> int:
        return self.rows - self.invalid - self.duplicates


def write_csv(path: Path, rows: int, first_due_ms: int, spread_ms: int,
              bad_every: int = 0, labelled: bool = False) -> Expected:
    """rows data rows due over [first_due_ms, first_due_ms + spread_ms). With bad_every, every
    bad_every-th row is invalid (cycling through three kinds) and the row after each 7th
    invalid one repeats the last valid row exactly. labelled: rows carry a labels column
    (tier gold on even rows, free on odd ones) and a timezone (Asia/Tokyo on odd rows)."""
    invalid = duplicates = 0
    last_valid: list[str] = []
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(HEADER + (["labels", "timezone"] if labelled else []))
        for i in range(rows):
            due = str(first_due_ms + i * spread_ms // max(rows, 1))
            row = [f"user{i}", f"Hello {i}", due, str(i % 7)]
            if bad_every and i % bad_every == bad_every - 1:
                kind = (i // bad_every) % 3
                row = [["", row[1], due, "1"], [row[0], row[1], due, "70000"],
                       [row[0], row[1], "next tuesday", "1"]][kind]
                invalid += 1
            elif bad_every and i % (bad_every * 7) == 0 and last_valid:
                row = last_valid
                duplicates += 1
            else:
                last_valid = row
            if labelled:
                row = [*row, f'{{"tier": "{"free" if i % 2 else "gold"}"}}',
                       "Asia/Tokyo" if i % 2 else ""]
            out.writerow(row)
    return Expected(rows, invalid, duplicates)
