"""A progress line on stderr for the benchmarks, so a long run shows it is alive: redrawn in
place on a terminal (at most twice a second), a line every 10 s otherwise. Call it between
measurements, never inside a timed region; stdout keeps only the results table."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, what: str = "rounds", stream=sys.stderr):
        self.total, self.what, self.stream = total, what, stream
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self._last = float("-inf")

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last < (0.5 if self.tty else 10.0) and done < self.total:
            return
        self._last = now
        line = f"{done}/{self.total} {self.what}  {now - self.t0:6.1f}s"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
