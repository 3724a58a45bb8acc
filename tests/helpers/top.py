"""What the top tests share: a frame as text, its tables as rows, cells as numbers, a port
nobody listens on, and `dpobs top` live in a private tmux server."""
from __future__ import annotations

import io
import os
import re
import shlex
import socket
import subprocess
import time

from dpobs_otel.top.prometheus import RulesSource
from dpobs_otel.top.view import frame


def text(answers, width: int = 160) -> str:
    from rich.console import Console
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(frame(answers))
    return buf.getvalue()


def table(shown: str, title: str) -> list[dict[str, str]]:
    """The rows of one table of a frame, as {column header: cell} (cells are separated by
    at least two spaces; headers and cells hold at most single spaces)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("─"))
    cols = re.split(r"\s{2,}", lines[rule - 1].strip())
    rows = []
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(cols, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


UNIT = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def number(cell: str) -> float:
    """A cell as a number in base units: 12.3% -> 0.123, '4.56 MB/s' -> 4.56e6."""
    if cell.endswith("%"):
        return float(cell[:-1]) / 100
    value, _, unit = cell.partition(" ")
    return float(value) * UNIT[unit.removesuffix("/s")] if unit else float(value)


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connecting is refused


class Canned(RulesSource):
    """What a Prometheus answers (series: expr -> [(labels, value)]; nothing else, no alerts),
    without one."""

    def __init__(self, series: dict[str, list[tuple[dict, float]]]):
        super().__init__("http://127.0.0.1:1")
        self.series = series

    def query(self, expr):
        return self.series.get(expr, [])

    def _alerts(self):
        return []


class Tmux:
    """A private tmux server (its own socket); each pane runs one command and keeps its last
    screen if the command exits (so a crash shows in the capture)."""

    def __init__(self):
        self.socket = f"dpobs-top-test-{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES",
                                                                      "TMUX")}

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              check=True, capture_output=True, text=True, env=self.env,
                              timeout=30).stdout

    def start(self, name: str, argv: list[str], rows: int = 60) -> None:
        cmd = f"{shlex.join(argv)}; echo EXITED $?; sleep 3600"
        self.tmux("new-session", "-d", "-s", name, "-x", "170", "-y", str(rows), cmd)

    def capture(self, name: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", name)

    def frame_after(self, name: str, t: float, timeout: float = 60) -> str:
        """The first whole frame drawn from answers taken after wall-clock time t, captured
        twice alike (a capture never catches a redraw half-way)."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.capture(name)
            assert "EXITED" not in shown and "Traceback" not in shown, shown
            stamp = re.search(r"· (\d\d:\d\d:\d\d)", shown)
            if stamp and "Processes" in shown and _after(stamp[1], t):
                time.sleep(0.3)
                if self.capture(name).split("·", 3)[3:] == shown.split("·", 3)[3:]:
                    return shown
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


def _after(hms: str, t: float) -> bool:
    """A frame's HH:MM:SS stamp (local time) is a whole second later than t."""
    return stamp(hms, t) >= int(t) + 1


def stamp(hms: str, near: float) -> float:
    """A frame's HH:MM:SS (local time) as epoch seconds, on the day of `near`."""
    day = time.localtime(near)
    return time.mktime(time.strptime(time.strftime("%Y-%m-%d ", day) + hms,
                                     "%Y-%m-%d %H:%M:%S"))
