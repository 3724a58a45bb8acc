"""`dpobs doctor` (issue 56) against live set-ups on loopback, each breaking one link of the
chain: a healthy stack (Prometheus scraping the job's file_sd directory with the shipped
rules, an Alertmanager) passes; a process registered where that Prometheus does not look, a
Prometheus without dpobs's rules, one without native histograms, an agent whose remote write is refused and an Alertmanager
that is down each fail the check of that link, named in its line, with exit 1. One stack for
the module; the Alertmanager is stopped by the last test."""
from __future__ import annotations

import time

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.cli import main
from dpobs_otel.doctor.command import diagnose
from dpobs_otel.testing.prometheus import Agent, Central, rule_files
from dpobs_otel.testing.stack import Stack, binaries

JOB = "doctor"


def work(tel, steps: int = 3) -> None:
    """A few steps over the reference store: every series the rules read exists."""
    client = tel.instrument(dpobs.InMemoryDataPlane())
    for step in range(steps):
        ids = [f"{step}-{i}" for i in range(4)]
        with tel.step():
            client.put_samples(ids, "p", TensorDict({"x": torch.ones(4, 8)}, batch_size=[4]))
            client.get_samples(ids, "p", ["x"])
            client.clear_samples(ids, "p")


def wait_for(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """A stack scraping its file_sd directory, with one trainer of job JOB registered there
    and stepping, once Prometheus has scraped it and evaluated its rules after that."""
    if None in binaries().values():
        pytest.fail(f"prometheus and alertmanager must be on PATH: {binaries()}")
    with Stack() as stack:
        tel = dpobs.start(role="trainer", rank=0, job=JOB, sd_dir=stack.sd_dir)
        try:
            work(tel)
            t0 = time.time()
            [target] = [t for t in dpobs_targets(stack.sd_dir)]
            stack.wait_scraped([target], after=t0)
            stack.wait_evaluated(after=time.time())
            yield stack, tel
        finally:
            tel.shutdown()


def dpobs_targets(sd_dir: str) -> list[str]:
    from dpobs_otel.readback.scrape import targets
    return [t.address for t in targets(sd_dir, JOB)]


def lines(checks) -> dict[str, str]:
    return {c.name: c.line() for c in checks}


def failed(checks) -> dict[str, str]:
    return {c.name: c.line() for c in checks if c.ok is False}


def test_a_healthy_job_passes_every_check_and_exits_0(healthy, capsys):
    stack, _ = healthy
    found = diagnose(stack.sd_dir, stack.prometheus, stack.alertmanager, JOB)
    assert failed(found) == {}, lines(found)
    held = {c.name for c in found if c.ok}
    assert held >= {"registered", "answering /metrics", "prometheus", "scraped and up",
                    "recording rules loaded", "rules evaluating", "alert rules loaded",
                    "alertmanager", "native histograms", "label budget"}, lines(found)
    argv = ["doctor", "--sd-dir", stack.sd_dir, "--prometheus", stack.prometheus,
            "--alertmanager", stack.alertmanager, "--job", JOB]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "Traceback" not in out and out.count("\n") == len(found) + 1


def test_a_process_the_prometheus_does_not_scrape_is_named(healthy, tmp_path, capsys):
    stack, _ = healthy
    elsewhere = str(tmp_path / "sd")  # registered, but not where Prometheus looks
    tel = dpobs.start(role="rollout", rank=3, job=JOB, sd_dir=elsewhere)
    try:
        work(tel, 1)
        found = diagnose(elsewhere, stack.prometheus, None, JOB)
        bad = failed(found)
        assert list(bad) == ["scraped and up"], lines(found)
        assert "not in Prometheus" in bad["scraped and up"] and "rollout 3" in bad["scraped and up"]
        assert "file_sd_configs" in bad["scraped and up"]  # the fix
        assert main(["doctor", "--sd-dir", elsewhere, "--prometheus", stack.prometheus]) == 1
        assert "FAIL  scraped and up" in capsys.readouterr().out
    finally:
        tel.shutdown()


def test_a_prometheus_without_dpobs_rules_fails_the_rules_checks(healthy, capsys):
    stack, _ = healthy
    with Central(rules=[], scrape_sd=stack.sd_dir) as bare:
        wait_for(lambda: any(r["value"] == 1 for r in bare.query(f'up{{job="{JOB}"}}')),
                 what="the bare Prometheus scrapes the trainer")
        found = diagnose(stack.sd_dir, bare.url, None, JOB)
        bad = failed(found)
        assert {"recording rules loaded", "alert rules loaded"} <= set(bad), lines(found)
        assert "not loaded" in bad["recording rules loaded"]
        assert "rule_files" in bad["recording rules loaded"]  # the fix
        assert lines(found)["scraped and up"].startswith("ok")  # the links before it hold
        assert main(["doctor", "--sd-dir", stack.sd_dir, "--prometheus", bare.url]) == 1
        assert "FAIL  recording rules loaded" in capsys.readouterr().out


def test_a_prometheus_without_native_histograms_is_named(healthy, tmp_path):
    """dpobs's rules loaded, but native histograms off: the trainer serves them in vain."""
    stack, _ = healthy
    with Central(rule_files(tmp_path), native=False, scrape_sd=stack.sd_dir) as classic:
        wait_for(lambda: any(r["value"] == 1 for r in classic.query(f'up{{job="{JOB}"}}')),
                 what="the classic-only Prometheus scrapes the trainer")
        found = diagnose(stack.sd_dir, classic.url, None, JOB)
        bad = failed(found)
        assert "native histograms" in bad, lines(found)
        assert "trainer 0" in bad["native histograms"]
        assert "--enable-feature=native-histograms" in bad["native histograms"]
        assert lines(found)["recording rules loaded"].startswith("ok")


def test_an_agent_whose_remote_write_is_refused_is_named(healthy, tmp_path):
    """The agent scrapes its node's directory and writes to a Prometheus that takes no
    remote write (no --web.enable-remote-write-receiver): its processes never arrive."""
    stack, _ = healthy
    node_sd = str(tmp_path / "node-sd")
    tel = dpobs.start(role="rollout", rank=7, job=JOB, sd_dir=node_sd)
    agent = Agent(node_sd, f"{stack.prometheus}/api/v1/write", node="n1")
    try:
        work(tel, 1)
        agent.start()
        wait_for(lambda: "server returned HTTP status 404" in agent.log()
                 or "non-recoverable error" in agent.log(), 45, "the agent's write refused")
        bad = failed(diagnose(node_sd, stack.prometheus, None, JOB))
        assert "scraped and up" in bad, bad
        line = bad["scraped and up"]
        assert "rollout 7" in line and "not in Prometheus" in line
        assert "remote-write" in line and "--web.enable-remote-write-receiver" in line
    finally:
        agent.close()
        tel.shutdown()


def test_an_alertmanager_that_is_down_is_named_last(healthy, capsys):
    """Stops the stack's Alertmanager: the module's last test."""
    stack, _ = healthy
    am = stack.procs["alertmanager"]
    am.terminate()
    am.wait(timeout=10)
    for given in (stack.alertmanager, None):  # given, or found through Prometheus
        found = diagnose(stack.sd_dir, stack.prometheus, given, JOB)
        bad = failed(found)
        assert list(bad) == ["alertmanager"], lines(found)
        assert stack.alertmanager in bad["alertmanager"]
        assert "does not answer" in bad["alertmanager"]
    assert main(["doctor", "--prometheus", stack.prometheus, "--alertmanager",
                 stack.alertmanager]) == 1
    assert "FAIL  alertmanager" in capsys.readouterr().out
