"""asyncio plumbing of webhook POSTs: the event loop to use, and concurrency slots handed out
by priority, then in turns across fair-delivery groups.

uvloop runs the loop when it is installed (it is a dependency; the standard loop otherwise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.delivery.fairness import FairQueue

try:
    import uvloop

    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency; the standard loop also works
    new_loop = asyncio.new_event_loop


class PrioritySlots:
    """At most `size` holders at a time; waiters get a slot lowest priority first, then
    taking turns across fair-delivery groups (app.delivery.fairness.FairQueue), then lowest due_ms,
    then in arrival order. Loop thread only."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: FairQueue[asyncio.Future[None]] = FairQueue()

    async def acquire(self, priority: int, due_ms: int, group: str | None = None) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.push(turn, group, priority, due_ms)
        try:
            await turn  # release() handed its slot over: `free` was not given back
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed over just as we were cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            turn = self._waiting.pop()
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                return
        self.free += 1
