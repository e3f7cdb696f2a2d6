"""The walk's record of one webhook topic: per owned shard, how far its timeline has been read
(docs/design.md, "How a due message is found"). Pure: the releaser reads and writes.

`position[shard]`: every pointer of the shard due before it was read into the timer heap (or
found spent) by a read that began at `read_at`, or lies behind the durable cursor the walk
started from. A pointer that lands behind the position later is one due soon after its write
(app.core.timeline.COUNTED_AHEAD_MS): it moves its (bucket, shard)'s write count, and the
next step reads that shard again from the safety lag before the previous read began (a
writer's clock may trail the releaser's that much; one further behind is the sweep's
catch-up's). A
shard whose counts stand is read on from its position once the position comes within
`refill_ms` of the look-ahead's end, so each pointer is read about once. `cursor[shard]`: the
durable cursor as the walk started from it or last wrote it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

Cell = tuple[int, int]  # (bucket, shard)


@dataclasses.dataclass
class Walk:
    shards: frozenset[int]
    position: dict[int, int]  # epoch ms, per owned shard
    cursor: dict[int, int]  # epoch ms, per owned shard
    cells: dict[Cell, int | None] = dataclasses.field(default_factory=dict)
    read_at: int | None = None  # epoch ms: when the last read began; None: never read

    @classmethod
    def starting_at(cls, cursors: Mapping[int, int]) -> Walk:
        """A walk of these shards from their durable cursors."""
        return cls(frozenset(cursors), dict(cursors), dict(cursors))

    def moved(self, counts: Mapping[Cell, int]) -> set[int]:
        """The owned shards with a cell whose count differs from the one recorded (a cell
        never recorded included)."""
        return {s for (b, s), n in counts.items() if s in self.shards
                and self.cells.get((b, s), -1) != n}

    def starts(self, counts: Mapping[Cell, int], horizon_ms: int, refill_ms: int,
               safety_lag_ms: int) -> dict[int, int]:
        """{shard: where this step's read of it starts (epoch ms)}, given the counts of the
        window's buckets read now; empty when nothing needs a read."""
        if self.read_at is None:  # a new walk reads everything from its cursors
            return dict(self.position)
        floor = self.read_at - safety_lag_ms
        moved = self.moved(counts)
        starts = {}
        for s, at in self.position.items():
            if s in moved:
                starts[s] = min(at, floor)
            elif at <= horizon_ms - refill_ms:
                starts[s] = at
        return starts

    def record(self, began_ms: int, starts: Mapping[int, int], frontier: Mapping[int, int],
               to_ms: int, window: list[int], counts: Mapping[Cell, int],
               incomplete: set[Cell]) -> None:
        """After a read that began at began_ms (its counts read then, before the pointers):
        each read shard's position is how far the read got, and its cells in the window's
        buckets are recorded with their counts, unless the read stopped short of to_ms or a
        pointer of the cell was left unread or unsettled (its row still in flight): those
        count as moved, so the next step reads them again."""
        self.read_at = began_ms
        if window:  # what lies before the window is never compared again
            self.cells = {cell: n for cell, n in self.cells.items() if cell[0] >= window[0]}
        for s in starts:
            self.position[s] = frontier[s]
            whole = frontier[s] >= to_ms
            for b in window:
                if whole and (b, s) not in incomplete:
                    self.cells[(b, s)] = counts.get((b, s))
                else:
                    self.cells.pop((b, s), None)

    def read_again(self, shard: int, due_ms: int) -> None:
        """A pointer the walk passed must be read again (its take failed): the shard's
        position goes back to its due time (epoch ms), so the cursor stays behind it too."""
        if shard in self.position:
            self.position[shard] = min(self.position[shard], due_ms)

    def passed_empty(self, now_ms: int, horizon_ms: int, window_start_ms: int) -> bool:
        """Nothing of the topic lies in the window's buckets (active_topics): every position
        at or after the window's start moves to the window's end without a read. False when
        a position is behind the window's start, which only a read may pass."""
        if self.read_at is None or min(self.position.values()) < window_start_ms:
            return False
        self.read_at = now_ms
        for s in self.position:
            self.position[s] = max(self.position[s], horizon_ms)
        return True

    def cursor_moves(self, now_ms: int, safety_lag_ms: int, held: Mapping[int, int],
                     step_ms: int) -> dict[int, int]:
        """Durable cursor moves of at least step_ms: never past the position, now less the
        safety lag, or the earliest timer still held of the shard (`held`). Recorded as
        made; the caller writes them."""
        moves = {}
        for s, at in self.cursor.items():
            through = min(self.position[s], now_ms - safety_lag_ms, held.get(s, self.position[s]))
            if through >= at + step_ms:
                moves[s] = through
        self.cursor.update(moves)
        return moves
