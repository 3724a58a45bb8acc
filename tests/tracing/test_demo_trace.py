"""`dpobs demo --trace`: both outputs written where it says, for the measured steps alone;
without matplotlib, the JSON and the extra to install."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys

from dpobs_otel.demo.batches import Config
from dpobs_otel.tracing import command, picture

STEPS = 3


def test_demo_trace_writes_the_measured_steps_and_says_where(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "demo", "--trace", "--steps",
                        str(STEPS), "--trainers", "2", "--stack", "off", "--store-latency-ms",
                        "1", "--log-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = re.search(r"Timeline \((\d+) processes\): (\S+)", r.stdout)
    assert said and said.group(1) == "4", r.stdout[-2000:]  # rollout, 2 trainers, driver
    assert said.group(2) == str(tmp_path / "trace.json")
    assert f"picture of the last steps: {tmp_path / 'timeline.png'}" in r.stdout
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    # step 1 is the warm-up: the trace holds the measured steps 2..STEPS+1 of every process
    assert sorted({e["args"]["step"] for e in steps}) == list(range(2, STEPS + 2))
    assert len(steps) == 4 * STEPS
    ops = {e["name"] for e in events if e.get("cat") == "op"}
    assert ops == {"put", "get", "list", "clear"}


def test_without_matplotlib_the_json_is_written_and_the_extra_named(tmp_path, monkeypatch):
    monkeypatch.setattr(picture, "has_matplotlib", lambda: False)
    out = io.StringIO()
    command.demo_outputs(Config(steps=STEPS, trace=True), {}, str(tmp_path), out)
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"] == []
    assert "pip install 'dpobs-otel[timeline]'" in out.getvalue()
    assert not (tmp_path / "timeline.png").exists()
