"""The walk's record of one topic: per owned shard, how far its timeline has been read
(docs/design.md, "How a due message is found"). Pure: the releaser reads and writes.

`position[shard]`: every pointer of the shard due before it was read into the broker (or
found spent) by a read that began at `read_at`, or lies behind the durable cursor the walk
started from. A pointer that lands behind the position later is one due soon after its write
(app.core.timeline.COUNTED_AHEAD_MS): it moves its (bucket, shard)'s write count, and the
next step reads that shard again from the safety lag before the previous read began (a
writer's clock may trail the releaser's half that much, and its write take the other half;
a write that finished later places its pointer again: app.messages.placement). A shard
whose counts stand is read on from its position once the position comes within
`refill_ms` of the look-ahead's end; each read goes on to the reach (app.core.timeline.
COUNTED_AHEAD_MS less the safety lag ahead of now), so each pointer is read about once.
`cursor[shard]`: the durable cursor as the walk started from it or last wrote it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

Cell = tuple[int, int]  # (bucket, shard)
Lane = tuple[int, int]  # (shard, fair-delivery lane)


@dataclasses.dataclass
class Walk:
    shards: frozenset[int]
    position: dict[int, int]  # epoch ms, per owned shard
    cursor: dict[int, int]  # epoch ms, per owned shard
    pushed: bool = True  # whether its topic is a webhook topic (else pull) when it began
    # lanes with a position of their own, behind their shard's: a read the quota stopped
    # there (a backlog), or one whose room is used up (`closed`: the broker holds enough)
    lanes: dict[Lane, int] = dataclasses.field(default_factory=dict)
    cells: dict[Cell, int | None] = dataclasses.field(default_factory=dict)
    read_at: int | None = None  # epoch ms: when the last read began; None: never read
    # held by whoever reads the topic's shards (the walk's step, or a broker's read_now)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False,
                                             compare=False)

    @classmethod
    def starting_at(cls, cursors: Mapping[int, int], pushed: bool = True) -> Walk:
        """A walk of these shards from their durable cursors."""
        return cls(frozenset(cursors), dict(cursors), dict(cursors), pushed)

    def moved(self, counts: Mapping[Cell, int]) -> set[int]:
        """The owned shards with a cell whose count differs from the one recorded (a cell
        never recorded included)."""
        return {s for (b, s), n in counts.items() if s in self.shards
                and self.cells.get((b, s), -1) != n}

    def starts(self, counts: Mapping[Cell, int], horizon_ms: int, refill_ms: int,
               safety_lag_ms: int, closed: AbstractSet[Lane] = frozenset()) -> dict[int, int]:
        """{shard: where this step's read of it starts (epoch ms; its lanes with a position
        of their own from there)}, given the counts of the window's buckets read now; empty
        when nothing needs a read. A lane `closed` does not make its shard read."""
        if self.read_at is None:  # a new walk reads everything from its cursors
            return dict(self.position)
        floor = self.read_at - safety_lag_ms
        moved = self.moved(counts)
        behind = {s for (s, lane), at in self.lanes.items()
                  if (s, lane) not in closed and at <= horizon_ms - refill_ms}
        starts = {}
        for s, at in self.position.items():
            if s in moved:
                starts[s] = min(at, floor)
            elif at <= horizon_ms - refill_ms or s in behind:
                starts[s] = at
        return starts

    def lowest(self, shard: int) -> int:
        """Where nothing of the shard before is left unread (epoch ms): its position, or a
        lane's own, whichever is earlier."""
        return min([self.position[shard],
                    *(at for (s, _), at in self.lanes.items() if s == shard)])

    def record(self, began_ms: int, starts: Mapping[int, int], frontier: Mapping[int, int],
               to_ms: int, window: list[int], counts: Mapping[Cell, int],
               incomplete: set[Cell], lanes_ms: Mapping[Lane, int] | None = None,
               closed: AbstractSet[Lane] = frozenset()) -> None:
        """After a read that began at began_ms (its counts read then, before the pointers):
        each read shard's position is how far the read got, a lane the quota stopped keeps
        how far it got (`lanes_ms`), a lane `closed` (not read) where its shard's read began
        (a pointer that landed behind the position, as one due now does, was not read for
        it), and the other lanes of the read shards follow their shard again. Its cells in
        the window's buckets are recorded with their counts, unless the read stopped short
        of to_ms or a pointer of the cell was left unread or unsettled (its row still in
        flight): those count as moved, so the next step reads them again."""
        self.read_at = began_ms
        if window:  # what lies before the window is never compared again
            self.cells = {cell: n for cell, n in self.cells.items() if cell[0] >= window[0]}
        cut = dict(lanes_ms or {})
        for lane in list(self.lanes):
            if lane[0] in starts and lane not in cut and lane not in closed:
                del self.lanes[lane]  # read whole from where it was
        for lane in closed:  # not read from its shard's start: it goes on from there
            s = lane[0]
            if s in starts and lane not in cut:
                self.lanes[lane] = min(self.lanes.get(lane, starts[s]), starts[s])
        self.lanes.update((lane, at) for lane, at in cut.items() if lane[0] in starts)
        for s in starts:
            self.position[s] = frontier[s]
            whole = frontier[s] >= to_ms
            for b in window:
                if whole and (b, s) not in incomplete:
                    self.cells[(b, s)] = counts.get((b, s))
                else:
                    self.cells.pop((b, s), None)

    def counts_stood(self, read_ms: int) -> None:
        """The counts read at read_ms (epoch ms) showed no shard to read: that stands for a
        read begun then, since every pointer written before then that a read would find
        moved one of them. Never moves read_at back."""
        self.read_at = max(self.read_at or read_ms, read_ms)

    def read_again(self, shard: int, due_ms: int) -> None:
        """A pointer the walk passed must be read again (its take failed): the shard's
        position goes back to its due time (epoch ms), so the cursor stays behind it too."""
        if shard in self.position:
            self.position[shard] = min(self.position[shard], due_ms)

    def passed_empty(self, now_ms: int, horizon_ms: int, window_start_ms: int) -> bool:
        """Nothing of the topic lies in the window's buckets (active_topics): every position
        at or after the window's start moves to the window's end without a read. False when
        a position is behind the window's start, which only a read may pass."""
        if self.read_at is None or min(self.position.values()) < window_start_ms or \
                any(at < window_start_ms for at in self.lanes.values()):
            return False
        self.read_at = now_ms
        self.lanes.clear()  # nothing of theirs lies in the window either
        for s in self.position:
            self.position[s] = max(self.position[s], horizon_ms)
        return True

    def cursor_moves(self, now_ms: int, safety_lag_ms: int, held: Mapping[int, int],
                     step_ms: int) -> dict[int, int]:
        """Durable cursor moves of at least step_ms: never past the position, now less the
        safety lag, or the earliest message still held of the shard (`held`). Recorded as
        made; the caller writes them."""
        moves = {}
        for s, at in self.cursor.items():
            lowest = self.lowest(s)
            through = min(lowest, now_ms - safety_lag_ms, held.get(s, lowest))
            if through >= at + step_ms:
                moves[s] = through
        self.cursor.update(moves)
        return moves
