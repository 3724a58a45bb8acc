"""The demo's progress line on stderr: redrawn in place on a terminal, else a line every
10 s (compose and CI logs keep a record without a flood)."""
from __future__ import annotations

import sys

from .batches import Config


class Progress:
    """A plain-text progress line on stderr: redrawn in place on a terminal, else a line
    every few seconds."""

    def __init__(self, cfg: Config, stream=sys.stderr):
        self.cfg, self.stream = cfg, stream
        self.tty = stream.isatty()
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
        line = f"{bar}{tail}  {elapsed:6.1f}s  step {dt * 1e3:6.1f} ms"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
