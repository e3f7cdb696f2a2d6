"""The messages of one topic that the walk read and the broker holds for its lease calls or
its POST pool (workers/broker.py): by pointer, in the order in which they become ready, and
per turn group in the group's own order (app.delivery.fairness), so that a round reads only
the messages it may take, each group's first ones, not all it holds (up to 9 s of a busy
topic's messages ahead). Times are epoch ms.

Each message is kept as one tuple of plain values (UUIDs as ints), rebuilt as a Due when a
round reads it: Python's collector leaves such tuples untracked, and a full collection,
which stops every thread of the releaser, takes time in proportion to the objects it
tracks; a releaser may hold a hundred thousand messages of backlogs nobody leases.
"""

from __future__ import annotations

import bisect
import dataclasses
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from app.delivery.fairness import GroupPlace, TurnGroup, group_place, turn_group
from app.delivery.scan import Due, PointerKey, is_live
from app.models import MessageState, Pointer

Packed = tuple[Any, ...]  # _pack: the pointer's fields, then the row's but its topic_uid
_ROW_FIELDS = [f.name for f in dataclasses.fields(MessageState)][1:]
_POINTER_NAMES = [f.name for f in dataclasses.fields(Pointer)]
_POINTER_FIELDS = len(_POINTER_NAMES)
# the row's UUID fields, by index in Packed
_UUIDS = [_POINTER_FIELDS + i for i, name in enumerate(_ROW_FIELDS)
          if name in ("lease_token", "last_op")]


def _pack(d: Due) -> Packed:
    p, row = d.pointer, d.row
    values = [*(getattr(p, name) for name in _POINTER_NAMES),
              *(getattr(row, name) for name in _ROW_FIELDS)]
    for i in _UUIDS:
        if values[i] is not None:
            values[i] = values[i].int
    return tuple(values)


def _unpack(packed: Packed, topic_uid: uuid.UUID) -> Due:
    values = list(packed)
    for i in _UUIDS:
        if values[i] is not None:
            values[i] = uuid.UUID(int=values[i])
    return Due(Pointer(*values[:_POINTER_FIELDS]),
               MessageState(topic_uid, *values[_POINTER_FIELDS:]))


def ready_ms(row: MessageState) -> int:
    """The earliest moment the message may be handed out: its due time, and for a leased one
    not before its lease ends."""
    return max(row.due_at_ms, row.lease_expires_at_ms or 0)


class HeldMessages:
    """Not thread-safe: the broker's lock guards it."""

    def __init__(self, topic_uid: uuid.UUID, pushed: bool = False) -> None:
        self.topic_uid = topic_uid
        self.pushed = pushed  # a webhook topic's (else a pull topic's)
        self._by_key: dict[PointerKey, Packed] = {}
        self.lanes: Counter[tuple[int, int]] = Counter()  # held per (shard, lane)
        # (ready ms, key) of each held, sorted
        self._order: list[tuple[int, PointerKey]] = []
        # per turn group, (place in the group, key) of each held, sorted
        self._by_turn: dict[TurnGroup, list[tuple[GroupPlace, PointerKey]]] = {}
        # per shard, (pointer's due ms, key) of each held, sorted
        self._by_shard: dict[int, list[tuple[int, PointerKey]]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: PointerKey) -> bool:
        return key in self._by_key

    def get(self, key: PointerKey) -> Due:
        """The message held under key (KeyError when none is)."""
        return _unpack(self._by_key[key], self.topic_uid)

    def items(self) -> list[tuple[PointerKey, Due]]:
        """Every message held, with its key."""
        return [(key, _unpack(packed, self.topic_uid)) for key, packed in self._by_key.items()]

    def add(self, key: PointerKey, d: Due) -> None:
        if key in self._by_key:
            return
        self._by_key[key] = _pack(d)
        self.lanes[(d.pointer.shard, d.pointer.lane)] += 1
        bisect.insort(self._order, (ready_ms(d.row), key))
        bisect.insort(self._by_turn.setdefault(turn_group(d), []), (group_place(d), key))
        bisect.insort(self._by_shard.setdefault(d.pointer.shard, []), (d.pointer.due_at_ms, key))

    def remove(self, key: PointerKey) -> None:
        packed = self._by_key.pop(key, None)
        if packed is None:
            return
        d = _unpack(packed, self.topic_uid)
        _take_out(self._by_turn, turn_group(d), (group_place(d), key))
        _take_out(self._by_shard, d.pointer.shard, (d.pointer.due_at_ms, key))
        del self._order[bisect.bisect_left(self._order, (ready_ms(d.row), key))]
        lane = (d.pointer.shard, d.pointer.lane)
        self.lanes[lane] -= 1
        if self.lanes[lane] <= 0:
            del self.lanes[lane]

    def shards(self) -> set[int]:
        return set(self._by_shard)

    def earliest(self) -> dict[int, int]:
        """{shard: the earliest due time (epoch ms) of a pointer held of it}."""
        return {shard: entries[0][0] for shard, entries in self._by_shard.items()}

    def ready_by(self, until_ms: int) -> list[Due]:
        """Those that may be handed out by until_ms, earliest first."""
        found = []
        for ready, key in self._order:
            if ready > until_ms:
                break
            found.append(self.get(key))
        return found

    def firsts(self, now_ms: int, n: int, sort: Callable[[Due], str]) -> dict[str, list[Due]]:
        """The messages that may be handed out at now_ms (app.delivery.scan.is_live), by what
        sort(d) calls each: of each turn group its first n called "hand" in the group's own
        order, and all it called otherwise before them (made dead or passed over, say). A
        group is read only up to there, or up to its first message to be delivered after
        now_ms: none after it is due yet, as no row is due before its deliver_at
        (app.core.timeline.placement_ms)."""
        found: dict[str, list[Due]] = defaultdict(list)
        for entries in self._by_turn.values():
            handed = 0
            for (deliver_at_ms, _, _), key in entries:
                if deliver_at_ms > now_ms:
                    break
                d = self.get(key)
                if not is_live(d.pointer, d.row, now_ms):
                    continue
                kind = sort(d)
                found[kind].append(d)
                if kind == "hand":
                    handed += 1
                    if handed == n:
                        break
        return found

    def next_moment(self, now_ms: int) -> int | None:
        """The first moment after now_ms when a round may take one it could not take at
        now_ms (its due time, or the end of a consumer's lease on it: ready_ms); None when
        there is none."""
        # one ready by now_ms has no moment after it (a lease over, a due time passed)
        start = bisect.bisect_right(self._order, now_ms, key=lambda entry: entry[0])
        return self._order[start][0] if start < len(self._order) else None



def _take_out(index: dict[Any, list[Any]], name: Any, entry: Any) -> None:
    """Remove entry from the sorted list index[name], and the list once empty."""
    entries = index[name]
    del entries[bisect.bisect_left(entries, entry)]
    if not entries:
        del index[name]
