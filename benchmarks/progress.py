"""A progress line on stderr for the benchmarks, so a long run shows it is alive: redrawn in
place on a terminal (at most twice a second), a line every 10 s otherwise. Call it between
measurements, never inside a timed region; stdout keeps only the results table."""
from __future__ import annotations

import sys
import time

from dpobs_otel.demo.progress import Line


class Progress(Line):
    def __init__(self, total: int, what: str = "rounds", stream=sys.stderr):
        super().__init__(stream)
        self.total, self.what = total, what
        self.t0 = time.monotonic()
        self._last = float("-inf")

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last < (0.5 if self.tty else 10.0) and done < self.total:
            return
        self._last = now
        self.show(f"{done}/{self.total} {self.what}  {now - self.t0:6.1f}s")
