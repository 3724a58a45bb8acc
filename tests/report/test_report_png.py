"""`dpobs report` (issue 47): one PNG page of the overview's answers. From the cluster view of
a file_sd directory of live processes, every panel has a title, labelled axes with units and
data; the caption names its source; and every query it sends Prometheus is one the overview
dashboard runs, not a copy."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.report import answers
from dpobs_otel.cli import main
from dpobs_otel.report.command import build
from dpobs_otel.report.draw import figure
from dpobs_otel.report.queries import fill, overview_queries

REPO = Path(__file__).resolve().parents[2]
UNIT = re.compile(r"\([^)]+\)$")  # "... (ms)": every axis names its unit


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Two live processes' endpoints in one file_sd directory: a trainer that steps over a
    guarded store and sends weights, a rollout that receives them."""
    for var in ("DPOBS_SD_DIR", "DPOBS_JOB", "DPOBS_ROLE", "DPOBS_RANK", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)
    sd = tmp_path / "sd"
    trainer = dpobs.start(role="trainer", rank=0, sd_dir=str(sd), verify_tensor_hash=True)
    rollout = dpobs.start(role="rollout", rank=0, sd_dir=str(sd), verify_tensor_hash=True)
    client = trainer.instrument(dpobs.InMemoryDataPlane())
    for step in range(3):
        ids = [f"{step}-{i}" for i in range(4)]
        with trainer.step():
            client.put_samples(ids, "p", TensorDict({"x": torch.ones(4, 16)}, batch_size=[4]))
            client.get_samples(ids, "p", ["x"])
            client.clear_samples(ids, "p")
        weights = {"w": torch.full((8, 8), float(step))}
        items = list(trainer.weights.sent(iter(weights.items()), version=step))
        dict(rollout.weights.received(iter(items), version=step))
    yield sd
    trainer.shutdown()
    rollout.shutdown()


def test_every_panel_has_a_title_labelled_axes_with_units_and_data(job, tmp_path):
    page = build(None, str(job), "dpobs")
    assert [p.title for p in page.panels] == list(answers.ORDER) and not page.missing
    assert "cluster view" in page.caption and "no Prometheus" in page.caption
    fig = figure(page)
    drawn = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in drawn] == list(answers.ORDER)
    for ax in drawn:
        assert UNIT.search(ax.get_ylabel()) and ax.get_xlabel(), ax.get_title()
        heights = [bar.get_height() for bar in ax.patches]
        assert heights and all(h >= 0 for h in heights) and max(heights) > 0, ax.get_title()
    by = {p.title: p.bars for p in page.panels}
    assert set(by[answers.FRAC]["exposed"]) == {"trainer 0"}  # the rollout has no steps
    assert set(by[answers.WEIGHTS]["mean"]) == {"send", "receive"}
    assert by[answers.GUARD]["rows"]["checked"] == 12 and by[answers.GUARD]["rows"]["mismatched"] == 0
    assert by[answers.BYTES]["write"]["put"] == pytest.approx(4 * 16 * 4 / 1e6)  # per trainer step


def test_the_command_writes_a_png(job, tmp_path):
    out = tmp_path / "answers.png"
    assert main(["report", "--sd-dir", str(job), "--png", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_panel_without_data_is_named_in_the_caption_not_drawn(tmp_path):
    (tmp_path / "sd").mkdir()
    page = build(None, str(tmp_path / "sd"), "dpobs")
    assert page.panels == [] and page.missing == list(answers.ORDER)
    assert answers.WEIGHTS in page.caption


def test_the_queries_are_the_overview_dashboards_own():
    committed = json.loads((REPO / "dashboards" / "dpobs-overview.json").read_text())
    exprs = {t["expr"] for p in committed["panels"] for t in p.get("targets", [])}
    ours = overview_queries("grpo")
    used = ["Processes by data-plane fraction of step", "Processes by exposed fraction of step",
            "Share of data-plane time by op", "Latency by op: p50, p90, p99 and mean",
            "Bytes per second by op and direction",
            "Weight sync time: mean per side and the slowest receiver",
            "Guard: rows checked (5m)", "Guard: rows mismatched (5m)", "Guard: rows unverified"]
    for title in used:
        assert ours[title], title
        for q in ours[title]:
            assert any(fill(e, "grpo") == q for e in exprs), (title, q)
            assert 'job=~"grpo"' in q and "$" not in q, q


def _report(*argv: str):
    """`dpobs report ARGV` as a user runs it: (exit code, stdout, stderr)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "report", *argv],
                         capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout, out.stderr


def _one_line(err: str, *words: str) -> None:
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("dpobs report: ") and all(w in err for w in words), err


def test_a_prometheus_with_nothing_listening_is_one_line_and_exit_1(tmp_path):
    from helpers.top import refused_port
    url = f"http://127.0.0.1:{refused_port()}"
    rc, out, err = _report("--prometheus", url, "--png", str(tmp_path / "x.png"))
    assert rc == 1 and out == "" and not (tmp_path / "x.png").exists()
    _one_line(err, url, "unreachable")


def test_a_png_in_a_folder_that_is_not_there_is_one_line(tmp_path):
    (tmp_path / "sd").mkdir()
    png = tmp_path / "nonexist" / "x.png"
    rc, out, err = _report("--sd-dir", str(tmp_path / "sd"), "--png", str(png))
    assert rc == 1 and out == ""
    _one_line(err, str(png.parent), "no directory")


def test_a_missing_sd_dir_is_named_and_no_blank_png_written(tmp_path):
    missing = tmp_path / "nonexistent"
    rc, out, err = _report("--sd-dir", str(missing), "--png", str(tmp_path / "x.png"))
    assert rc == 1 and out == "" and not (tmp_path / "x.png").exists()
    _one_line(err, str(missing), "no such directory")


def test_the_report_prints_the_verdict_and_draws_it_under_the_title(job, tmp_path, capsys):
    from dpobs_otel.report.command import verdict
    page = build(None, str(job), "dpobs")
    # three steps of the trainer over a guarded store, 4 rows each; the rollout never steps
    assert page.verdict.startswith("data plane ") and " of the step (exposed " in page.verdict
    assert " on trainer 0; guard: checked 12 rows, mismatched 0" in page.verdict
    assert verdict(None, str(job), "dpobs") == page.verdict  # the demo's line, the same
    assert page.verdict in figure(page)._suptitle.get_text()
    assert main(["report", "--sd-dir", str(job), "--png", str(tmp_path / "a.png")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == page.verdict
