"""Lists cut into runs of a bounded length: reads and batches sent to Cassandra with a bounded
number of partitions or rows each (an IN list, a batch), the runs sent together."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """items in runs of at most `size` (> 0), in order; none for no items."""
    return [list(items[start:start + size]) for start in range(0, len(items), size)]


def packed(items: Sequence[T], key: Callable[[T], Hashable], size: int, keys: int
           ) -> list[list[T]]:
    """items in runs of at most `size` items (> 0) and at most `keys` distinct keys (> 0)
    each, the items of one key side by side (a key with more than `size` items spans
    several runs); keys in the order of their first item."""
    by_key: dict[Hashable, list[T]] = {}
    for item in items:
        by_key.setdefault(key(item), []).append(item)
    runs: list[list[T]] = []
    run: list[T] = []
    in_run = 0
    for group in by_key.values():
        for part in chunked(group, size):
            if run and (in_run == keys or len(run) + len(part) > size):
                runs.append(run)
                run, in_run = [], 0
            run += part
            in_run += 1
    if run:
        runs.append(run)
    return runs
