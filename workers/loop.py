"""asyncio plumbing of webhook POSTs: the event loop to use, and concurrency slots handed out
by priority.

uvloop runs the loop when it is installed (it is a dependency; the standard loop otherwise).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

try:
    import uvloop

    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency; the standard loop also works
    new_loop = asyncio.new_event_loop


class PrioritySlots:
    """At most `size` holders at a time; waiters get a slot lowest (priority, due_ms) first,
    then in arrival order. Loop thread only."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def acquire(self, priority: int, due_ms: int) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, due_ms, next(self._seq), turn))
        try:
            await turn  # release() handed its slot over: `free` was not given back
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed over just as we were cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            turn = heapq.heappop(self._waiting)[3]
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                return
        self.free += 1
