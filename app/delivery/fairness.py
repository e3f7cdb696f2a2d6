"""Fair delivery across groups: the order in which a pass hands out what it found due.

A message's fair-delivery group is its `group`, else its campaign (messages with neither
form one group). Within each priority value, the passes go round-robin across groups: the
first due message of every group, then the second of every group, and so on, each group in
(deliver_at, due time, id) order. What a pass finds due holds the head of every group's lane
(app.core.timeline.lane_of: each lane has timeline partitions of its own), so a group with a
backlog of 50,000 takes one turn in each round, not the whole pass.

A webhook topic's POSTs take turns the same way where they wait (FairQueue): for a slot of
the topic's POST concurrency.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # the POST process imports FairQueue without the storage modules
    from app.delivery.scan import Due

T = TypeVar("T")
MAX_TRACKED_GROUPS = 10_000  # then the groups with no turn ahead are forgotten


TurnGroup = tuple[int, str | None]
GroupPlace = tuple[int, int, str]


def turn_group(d: Due) -> TurnGroup:
    """What takes turns: a group within one priority value."""
    return d.row.priority, d.row.fair_group


def fair_order(due: Sequence[Due]) -> list[Due]:
    """due ordered by (priority, turn within its group, deliver_at, due time, id)."""
    ordered = sorted(due, key=lambda d: (d.row.priority, *group_place(d)))
    turns: dict[TurnGroup, int] = defaultdict(int)
    ranked = []
    for position, d in enumerate(ordered):
        group = turn_group(d)
        ranked.append((d.row.priority, turns[group], position, d))
        turns[group] += 1
    return [d for *_, d in sorted(ranked, key=lambda r: r[:3])]


def fair_first(due: Sequence[Due], n: int) -> list[Due]:
    """The first n of fair_order(due), without ordering the rest: a message's place is
    first its group's turn, so only each group's first n (in the group's own order) can be
    among them. A round handing out a few of thousands held sorts those few groups' heads."""
    if n >= len(due):
        return fair_order(due)
    groups: dict[TurnGroup, list[Due]] = defaultdict(list)
    for d in due:
        groups[turn_group(d)].append(d)
    heads: list[Due] = []
    for members in groups.values():
        heads += members if len(members) <= n else heapq.nsmallest(n, members, key=group_place)
    return fair_order(heads)[:n]


def group_place(d: Due) -> GroupPlace:
    """A message's place within its group: (deliver_at, due time, id)."""
    return d.row.deliver_at_ms, d.pointer.due_at_ms, d.pointer.id


class FairQueue(Generic[T]):
    """A queue that hands out the lowest priority value first, then takes turns across
    groups (one item of each group with items, then the next of each, ...), each group in
    (order, arrival) order. A group that arrives late, or comes back, joins at the round
    being served, so a group with a backlog of thousands takes one turn in each round.
    Not thread-safe."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, str | None], list[tuple[int, int, T]]] = {}
        self._turns: list[tuple[int, int, int, int, tuple[int, str | None]]] = []  # heads
        self._seq = itertools.count()
        self._last: dict[tuple[int, str | None], int] = {}  # a group's last turn
        self._serving: dict[int, int] = {}  # per priority, the turn handed out last
        self._size = 0

    def push(self, item: T, group: str | None, priority: int = 0, order: int = 0) -> None:
        key = (priority, group)
        items = self._groups.get(key)
        if items is None:  # the group joins the rounds: at the round being served
            items = self._groups[key] = []
            turn = max(self._last.get(key, -1) + 1, self._serving.get(priority, 0))
            heapq.heappush(self._turns, (priority, turn, order, next(self._seq), key))
            if len(self._last) > MAX_TRACKED_GROUPS:  # groups at or behind the round: as new
                self._last = {k: t for k, t in self._last.items()
                              if t >= self._serving.get(k[0], 0)}
        heapq.heappush(items, (order, next(self._seq), item))
        self._size += 1

    def pop(self) -> T:
        priority, turn, _, _, key = heapq.heappop(self._turns)
        items = self._groups[key]
        _, _, item = heapq.heappop(items)
        self._serving[priority] = turn
        self._last[key] = turn
        if items:
            heapq.heappush(self._turns, (priority, turn + 1, items[0][0], next(self._seq), key))
        else:
            del self._groups[key]
        self._size -= 1
        return item

    def __len__(self) -> int:
        return self._size
