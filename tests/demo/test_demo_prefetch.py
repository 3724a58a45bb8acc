"""`dpobs demo --prefetch` as a user runs it: the printed table of time on the critical path
holds, for every process over every step, busy and exposed from /metrics within 0.02 of the
workload's own clock, and the trainers' exposed fraction well under their busy one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def critical_path_rows(out: str) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{process: {"truth" | "metrics": (op-s, busy, exposed)}} of the every-step rows."""
    table = out.split("Time on the critical path", 1)[1].split("\n\n", 1)[0]
    rows, process, span = {}, None, None
    for line in table.splitlines()[2:]:
        m = re.match(r"  (\S+ \S+|job)?\s*(every step|measured steps)?\s+(truth|metrics|rules)"
                     r"\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%", line)
        if m is None:
            continue
        process = m.group(1) or process
        span = m.group(2) or span
        if span == "every step":
            rows.setdefault(process, {})[m.group(3)] = tuple(float(x) / 100
                                                             for x in m.group(4, 5, 6))
    return rows


def test_demo_prefetch_prints_busy_and_exposed_beside_the_truth(tmp_path):
    dpobs = Path(sys.executable).with_name("dpobs")
    out = subprocess.run(
        [dpobs, "demo", "--prefetch", "--steps", "12", "--train-ms", "40", "--batch-size",
         "16", "--max-len", "128", "--stack", "off", "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True).stdout
    rows = critical_path_rows(out)
    assert set(rows) == {"rollout 0", "trainer 0", "trainer 1", "driver 0", "job"}, out
    for process, got in rows.items():
        (_, busy_t, exposed_t), (_, busy_m, exposed_m) = got["truth"], got["metrics"]
        assert abs(busy_m - busy_t) <= 0.02 and abs(exposed_m - exposed_t) <= 0.02, (
            process, got)
        if process.startswith("trainer"):  # the read-ahead overlaps training
            assert exposed_m < 0.5 * busy_m, (process, got)
