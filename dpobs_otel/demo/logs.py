"""A file per backend for everything the backend says, so the terminal keeps dpobs's own lines.

Ray, TransferQueue and Mooncake log from places no Python setting reaches: C++ glog in the
workload processes, servers started as children, Ray's own threads. All of them write to file
descriptors 1 and 2, which children inherit, so those two are pointed at the backend's file
while it runs; dpobs's progress and tables go to `out` and `err`, duplicates of the terminal's
descriptors taken before. When the backend fails, the tail of its file is shown.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from .backends import BackendUnavailable

TAIL_LINES = 40


def log_dir(path: str | None) -> Path:
    """The folder for the backends' files: `path`, else a fresh one under the temp dir."""
    if path is None:
        return Path(tempfile.mkdtemp(prefix="dpobs-logs-"))
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})\n"


class BackendLog:
    """`with BackendLog(folder, name) as log:` fds 1 and 2 go to folder/name.log; write to
    log.out and log.err to reach the terminal (their isatty() is the terminal's)."""

    def __init__(self, folder: Path, name: str):
        self.name, self.path = name, Path(folder) / f"{name}.log"
        self.out = self.err = None
        self._saved: list[int] = []

    def __enter__(self) -> "BackendLog":
        _flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.out = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
        self.err = os.fdopen(os.dup(self._saved[1]), "w", buffering=1)
        print(f"{self.name}: its logs go to {self.path}", file=self.err)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        # a backend that could not start said why in one line (backends.BackendUnavailable)
        if exc_type is not None and not issubclass(exc_type, (KeyboardInterrupt,
                                                               BackendUnavailable)):
            print(f"{self.name} failed; the last lines of {self.path}:\n"
                  f"{tail(self.path)}", file=self.err)
        for stream in (self.out, self.err):
            stream.close()


def _flush() -> None:
    # What Python buffered belongs to the side of the switch it was written on.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
