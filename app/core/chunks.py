"""Lists cut into runs of a bounded length: reads and batches sent to Cassandra with a bounded
number of partitions or rows each (an IN list, a batch), the runs sent together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """items in runs of at most `size` (> 0), in order; none for no items."""
    return [list(items[start:start + size]) for start in range(0, len(items), size)]
