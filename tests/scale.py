"""How many messages the suite's largest tests move: a short form in `make test`, and the
scale the product claims (100,000 messages a topic or campaign) under `make long`, which
sets DUETIME_LONG=1 and runs the tests marked `long_form`."""

from __future__ import annotations

import os

LONG = os.environ.get("DUETIME_LONG") == "1"


def scaled(short: int, long: int) -> int:
    """`long` under `make long`, else `short`."""
    return long if LONG else short
