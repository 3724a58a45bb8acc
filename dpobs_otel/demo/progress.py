"""The demo's progress line on stderr: redrawn in place on a terminal, else a line every
10 s (compose and CI logs keep a record without a flood)."""
from __future__ import annotations

import sys

from .batches import Config


class Line:
    """One status line on a stream: redrawn in place on a terminal, appended elsewhere (the
    benchmarks' progress uses it too)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()

    def show(self, text: str) -> None:
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Progress(Line):
    """The demo's steps: a bar (or a count, for a timed run) and the last step's time."""

    def __init__(self, cfg: Config, stream=sys.stderr):
        super().__init__(stream)
        self.cfg = cfg
        self._last = float("-inf")  # the first step always prints

    def __call__(self, step: int, dt: float, elapsed: float, *_) -> None:
        if not self.tty and elapsed - self._last < 10:
            return
        self._last = elapsed
        cfg = self.cfg
        if cfg.duration is None:
            done, tail = step / max(cfg.steps, 1), f"{step}/{cfg.steps} steps"
        elif cfg.duration > 0:
            done, tail = elapsed / cfg.duration, f"{step} steps, {cfg.duration:.0f}s run"
        else:
            done, tail = None, f"{step} steps (Ctrl-C stops)"
        bar = "" if done is None else "[" + "#" * int(30 * min(done, 1)) + \
            "." * (30 - int(30 * min(done, 1))) + "] "
        self.show(f"{bar}{tail}  {elapsed:6.1f}s  step {dt * 1e3:6.1f} ms")
