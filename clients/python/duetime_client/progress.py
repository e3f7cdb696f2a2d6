"""Progress bars for long work (campaign operations in the CLI, Spark imports): redrawn in
place on a terminal, one line every few seconds anywhere else (CI logs, files)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


def bar(done: int, total: int | None, width: int = WIDTH) -> str:
    """`[#########.....] 61% 6,100/10,000`; without a total (or 0), just the count done."""
    if not total:
        return f"{done:,} done"
    share = min(max(done / total, 0.0), 1.0)
    filled = round(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {done:,}/{total:,}"


class ProgressBar:
    """Shows `label bar` on stream: every call redraws the line when stream is a terminal;
    otherwise the first call writes a line, then at most one every every_s seconds (and
    always one at finish)."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 2.0) -> None:
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.live = self.stream.isatty()
        self.started = time.monotonic()
        self._last_line: float | None = None  # monotonic s of the last line written
        self._drawn = False

    def show(self, label: str, done: int, total: int | None) -> None:
        line = f"{label} {bar(done, total)} ({time.monotonic() - self.started:.1f} s)"
        if self.live:
            self.stream.write("\r\x1b[2K" + line)
            self._drawn = True
        elif self._last_line is None or time.monotonic() - self._last_line >= self.every_s:
            self.stream.write(line + "\n")
            self._last_line = time.monotonic()
        self.stream.flush()

    def finish(self, text: str) -> None:
        """End the bar with a closing line."""
        if self._drawn:
            self.stream.write("\n")
        self.stream.write(f"{text} ({time.monotonic() - self.started:.1f} s)\n")
        self.stream.flush()
