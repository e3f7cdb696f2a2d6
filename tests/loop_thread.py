"""An event loop on a thread of its own, for tests and benches that are not async (the local
webhook receiver, raw socket servers, the raw POST ceiling)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from workers.loop import new_loop

T = TypeVar("T")


class LoopThread:
    """An event loop running on a daemon thread until stop()."""

    def __init__(self, name: str) -> None:
        self.loop = new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
