"""Waiting in tests for something another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], within_s: float, every_s: float = 0.01) -> bool:
    """True as soon as check() holds (asked every every_s seconds), else False once within_s
    seconds have passed and a last ask still says no."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every_s)
    return check()
