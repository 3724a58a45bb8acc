"""What the top tests share: a frame as text, its tables as rows, cells as numbers, and a
port nobody listens on."""
from __future__ import annotations

import io
import re
import socket

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
