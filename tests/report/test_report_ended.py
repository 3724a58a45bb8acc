"""`dpobs report` of a job that has ended (issue 56, DESIGN.md "Command line"): a short job
scraped by a loopback Stack, its processes stopped and its targets gone, still drawn from
Prometheus at its last evaluation, with its verdict; `--at TIME` reads the window ending at
TIME. Needs prometheus and alertmanager on PATH (the demo's stack)."""
from __future__ import annotations

import time

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.cli import main
from dpobs_otel.readback.scrape import targets
from dpobs_otel.report.command import build
from dpobs_otel.testing.stack import Stack, binaries

JOB = "ended"
RULE = f'{names.JOB_FRAC_OF_STEP}{{job="{JOB}"}}'


def wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def ended():
    """A stack that scraped one guarded trainer of JOB stepping for a few seconds, then saw
    it stop: (stack, the time its rules last had a value)."""
    if None in binaries().values():
        pytest.fail(f"prometheus and alertmanager must be on PATH: {binaries()}")
    with Stack() as stack:
        tel = dpobs.start(role="trainer", rank=0, job=JOB, sd_dir=stack.sd_dir,
                          verify_tensor_hash=True)
        client = tel.instrument(dpobs.InMemoryDataPlane())
        [target] = [t.address for t in targets(stack.sd_dir, JOB)]
        try:
            start, step = time.monotonic(), 0
            while time.monotonic() - start < 5 or not stack.query(RULE):  # a few scrapes
                ids = [f"{step}-{i}" for i in range(4)]
                with tel.step():
                    client.put_samples(ids, "p", TensorDict({"x": torch.ones(4, 8)},
                                                            batch_size=[4]))
                    client.get_samples(ids, "p", ["x"])
                    client.clear_samples(ids, "p")
                step += 1
                time.sleep(0.05)
                assert time.monotonic() - start < 60, "the rules never evaluated the job"
            stack.wait_scraped([target], after=time.time())
            stack.wait_evaluated(after=time.time())
        finally:
            tel.shutdown()
        last = time.time()
        wait_for(lambda: not stack.query(RULE), "the job's rules gone stale")
        yield stack, last


def test_an_ended_job_is_drawn_at_its_last_evaluation_with_its_verdict(ended, tmp_path,
                                                                      capsys):
    stack, last = ended
    out = tmp_path / "ended.png"
    assert main(["report", "--prometheus", stack.prometheus, "--job", JOB,
                 "--png", str(out)]) == 0
    verdict, drawn = capsys.readouterr().out.splitlines()[:2]
    assert verdict.startswith("data plane ") and "no step measured" not in verdict
    assert "most in " in verdict and " on trainer 0; guard: checked " in verdict
    assert not verdict.endswith("checked 0 rows, mismatched 0")
    assert "the job's last evaluation" in drawn and out.read_bytes()[:4] == b"\x89PNG"
    page = build(stack.prometheus, None, JOB)
    titles = [p.title for p in page.panels]
    assert "Fraction of step per process" in titles and "Wire guard: rows" in titles


def test_at_a_time_reads_the_window_ending_then(ended, tmp_path, capsys):
    stack, last = ended
    before = build(stack.prometheus, None, JOB, at=last - 0.5)
    assert "5m ending at" in before.caption and before.verdict.startswith("data plane ")
    assert "no step measured" not in before.verdict
    empty = build(stack.prometheus, None, JOB, at=last - 3600)  # before the job began
    assert empty.panels == [] and empty.verdict.startswith("data plane: no step measured")


def test_at_needs_prometheus_and_a_time(tmp_path, capsys):
    (tmp_path / "sd").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["report", "--sd-dir", str(tmp_path / "sd"), "--at", "0", "--png",
              str(tmp_path / "x.png")])
    assert "--at needs --prometheus" in str(e.value)
    with pytest.raises(SystemExit):
        main(["report", "--prometheus", "http://127.0.0.1:9", "--at", "yesterday", "--png",
              str(tmp_path / "x.png")])
    assert "not epoch seconds nor an RFC 3339 time" in capsys.readouterr().err
