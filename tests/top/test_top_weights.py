"""`dpobs top`'s weight-sync lines from both sources: the file_sd source from synthetic scrapes
(the series written out in the exposition format as a process serves them), the Prometheus
source from canned query answers, and the PromQL that source sends run by the real promtool
over raw series. Expected values are worked out here from the schedules."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from dpobs_otel import names
from dpobs_otel.readback import scrape
from dpobs_otel.top import direct, weights
from helpers.top import Canned, number, table, text

JOB = "w"
SYNC = names.WEIGHTS_SYNC_DURATION_SERIES


def body(side=None, syncs=0, seconds=0.0, nbytes=0, version=None, step_s=None,
         step_sync_s=None, checked=None, mismatched=None) -> str:
    """One process's /metrics body: a weight side's series (a bucket too, which top skips),
    the steps, and a receiver's check with the guard on."""
    lines = []
    if side:
        lines += [f'{SYNC}_bucket{{side="{side}",le="+Inf"}} {syncs}',
                  f'{SYNC}_count{{side="{side}"}} {syncs}',
                  f'{SYNC}_sum{{side="{side}"}} {seconds}',
                  f'{names.WEIGHTS_TRANSFERRED_SERIES}{{side="{side}"}} {nbytes}',
                  f'{names.WEIGHTS_VERSION_SERIES}{{side="{side}"}} {version}']
    if step_s is not None:
        lines.append(f"{names.STEP_DURATION_SERIES}_sum {step_s}")
    if step_sync_s is not None:
        lines.append(f"{names.STEP_WEIGHT_SYNC_SERIES} {step_sync_s}")
    if checked is not None:
        lines.append(f"{names.WEIGHTS_CHECKED_SERIES} {checked}")
        lines += [f'{names.WEIGHTS_MISMATCHED_SERIES}{{reason="{r}"}} {n}'
                  for r, n in (mismatched or {}).items()]
    return "\n".join(lines) + "\n"


CLEAN = {"value": 0, "missing": 0, "unexpected": 0}
# Two scrapes 10 s apart. Between them:
#   trainer   sends 2 syncs in 7 s, 8 GB (mean 3.5 s, 8e9 / 7 B/s), versions 2 -> 4, and
#             those 7 s lie inside 40 s of its steps (17.5%)
#   rollout 0 receives both in 5 s (mean 2.5 s, 1.6e9 B/s), checks 200 tensors: 3 differ,
#             1 arrives unsent
#   rollout 1 takes neither: version 2, two behind the trainer's 4 (more than the default
#             lag of 1), no sync to average, 0 mismatched
#   driver    syncs no weights: no line
BEFORE = {
    ("trainer", "0"): body("send", 2, 6, 8e9, 2, step_s=40, step_sync_s=6),
    ("rollout", "0"): body("receive", 2, 4, 8e9, 2, step_s=40, checked=200, mismatched=CLEAN),
    ("rollout", "1"): body("receive", 2, 2, 8e9, 2, checked=200, mismatched=CLEAN),
    ("driver", "0"): body(step_s=40),
}
AFTER = {
    ("trainer", "0"): body("send", 4, 13, 16e9, 4, step_s=80, step_sync_s=13),
    ("rollout", "0"): body("receive", 4, 9, 16e9, 4, step_s=80, checked=400,
                           mismatched={"value": 3, "missing": 0, "unexpected": 1}),
    ("rollout", "1"): BEFORE[("rollout", "1")],
    ("driver", "0"): body(step_s=80),
}


def file_sd(monkeypatch, tmp_path, clock: dict) -> direct.DirectSource:
    """A DirectSource whose scrapes answer clock["bodies"][(role, rank)] at clock["t"]."""
    def scrape_all(listed, **kw):
        return {t: scrape.parse(clock["bodies"][(t.label("role"), t.label("rank"))], clock["t"])
                for t in listed if (t.label("role"), t.label("rank")) in clock["bodies"]}
    targets = [scrape.Target(f"h{i}:9000", (("job", JOB), ("node", f"n{i}"), ("rank", rank),
                                             ("role", role)))
               for i, (role, rank) in enumerate([*AFTER, ("rollout", "2")])]
    monkeypatch.setattr(direct.scrape, "targets", lambda sd, job=None: targets)
    monkeypatch.setattr(direct.scrape, "scrape_all", scrape_all)
    return direct.DirectSource(str(tmp_path))


def test_file_sd_source_shows_each_side_its_version_lag_time_bandwidth_and_checks(
        monkeypatch, tmp_path):
    clock = {"t": 1000.0, "bodies": BEFORE}
    src = file_sd(monkeypatch, tmp_path, clock)
    assert src.answers().weights == []  # one snapshot: no window yet
    clock["t"], clock["bodies"] = 1010.0, AFTER
    a = src.answers()

    lines = {(w.role, w.rank): w for w in a.weights}
    assert [(w.role, w.side) for w in a.weights] == [
        ("trainer", "send"), ("rollout", "receive"), ("rollout", "receive")]  # senders first
    send, good, stale = lines["trainer", "0"], lines["rollout", "0"], lines["rollout", "1"]
    assert (send.version, send.behind, send.checked, send.mismatched) == (4, None, None, None)
    assert send.mean_s == pytest.approx(3.5)
    assert send.bytes_per_s == pytest.approx(8e9 / 7)
    assert send.step_share == pytest.approx(7 / 40)
    assert (good.version, good.behind, good.step_share) == (4, 0, None)
    assert (good.mean_s, good.bytes_per_s) == (pytest.approx(2.5), pytest.approx(1.6e9))
    assert (good.checked, good.mismatched) == (200, {"value": 3, "missing": 0, "unexpected": 1})
    assert (stale.version, stale.behind, stale.mean_s, stale.bytes_per_s) == (2, 2, None, None)
    assert (stale.checked, stale.mismatched) == (0, CLEAN)

    rows = {(r["role"], r["rank"]): r for r in table(text(a), "Weight sync")}
    assert set(rows) == {("trainer", "0"), ("rollout", "0"), ("rollout", "1")}
    shown = rows["trainer", "0"]
    assert (shown["side"], shown["node"], shown["version"], shown["behind"]) == (
        "send", "n0", "4", "-")
    assert number(shown["mean s"]) == 3.5
    assert number(shown["bandwidth"]) == pytest.approx(8e9 / 7, rel=5e-3)  # 3 digits
    assert number(shown["share of step"]) == pytest.approx(0.175, abs=5e-4)
    assert rows["rollout", "0"]["mismatched"] == "unexpected 1, value 3"
    assert (rows["rollout", "1"]["behind"], rows["rollout", "1"]["mismatched"],
            rows["rollout", "1"]["mean s"]) == ("2", "0", "-")


def test_no_weight_sync_no_table(monkeypatch, tmp_path):
    clock = {"t": 1000.0, "bodies": {("driver", "0"): BEFORE[("driver", "0")]}}
    src = file_sd(monkeypatch, tmp_path, clock)
    src.answers()
    clock["t"] = 1010.0
    a = src.answers()
    assert a.weights == [] and "Weight sync" not in text(a)


def test_a_receiver_first_seen_after_top_started_counts_its_checks_whole(monkeypatch,
                                                                          tmp_path):
    """As the rules count a series born in the window: a receiver whose first sync already
    failed must show its mismatches, though its counters do not move after top sees it."""
    clock = {"t": 1000.0, "bodies": dict(BEFORE)}
    src = file_sd(monkeypatch, tmp_path, clock)
    src.answers()
    late = body("receive", 1, 3, 4e9, 4, checked=100,
                mismatched={"value": 0, "missing": 2, "unexpected": 0})
    for t in (1010.0, 1020.0):
        clock["t"], clock["bodies"] = t, AFTER | {("rollout", "2"): late}
        a = src.answers()
    (line,) = [w for w in a.weights if w.rank == "2"]
    assert (line.checked, line.mismatched) == (100, {"value": 0, "missing": 2, "unexpected": 0})
    assert (line.version, line.behind, line.mean_s) == (4, 0, None)


def test_a_restarted_process_starts_a_new_window():
    """Weight counters below their earlier values (or gone) mean a new process."""
    before = scrape.parse(BEFORE[("rollout", "0")])
    restarted = scrape.parse(body("receive", 1, 1, 4e9, 3, checked=100, mismatched=CLEAN))
    assert restarted.went_back(before) and not scrape.parse(
        AFTER[("rollout", "0")]).went_back(before)
    assert scrape.parse(BEFORE[("driver", "0")]).went_back(before)


def _proc(role: str, rank: str, node: str) -> dict:
    return {"job": JOB, "node": node, "instance": f"{role}{rank}:9000", "role": role,
            "rank": rank}



def test_prometheus_source_reads_per_process_weight_queries():
    trainer, r0, r1 = (_proc("trainer", "0", "n1"), _proc("rollout", "0", "n1"),
                       _proc("rollout", "1", "n2"))
    send, recv = {"side": "send"}, {"side": "receive"}
    q = weights.SIDE_QUERIES | weights.PROCESS_QUERIES
    src = Canned({
        q["version"]: [(trainer | send, 9.0), (r0 | recv, 9.0), (r1 | recv, 6.0)],
        q["mean_s"]: [(trainer | send, 3.5), (r0 | recv, 2.5)],
        q["bytes_per_s"]: [(trainer | send, 2e9), (r0 | recv, 1.6e9)],
        q["step_share"]: [(trainer, 0.175)],
        q["checked"]: [(r0, 200.0), (r1, 0.0)],
        weights.MISMATCHED: [(r0 | {"reason": r}, n) for r, n in
                             (("value", 3.0), ("missing", 0.0), ("unexpected", 1.0))]
                            + [(r1 | {"reason": "value"}, 0.0)],
    })
    a = src.answers()
    assert not a.error
    got = [(w.role, w.rank, w.node, w.side, w.version, w.behind, w.mean_s, w.bytes_per_s,
            w.step_share, w.checked, w.mismatched) for w in a.weights]
    assert got == [
        ("trainer", "0", "n1", "send", 9.0, None, 3.5, 2e9, 0.175, None, None),
        ("rollout", "0", "n1", "receive", 9.0, 0.0, 2.5, 1.6e9, None, 200.0,
         {"value": 3.0, "missing": 0.0, "unexpected": 1.0}),
        ("rollout", "1", "n2", "receive", 6.0, 3.0, None, None, None, 0.0, {"value": 0.0}),
    ]
    rows = {r["rank"]: r for r in table(text(a), "Weight sync") if r["role"] == "rollout"}
    assert (rows["1"]["behind"], rows["0"]["mismatched"]) == ("3", "unexpected 1, value 3")


def test_prometheus_queries_compute_per_process_values_in_promtool(tmp_path):
    """The PromQL the Prometheus source sends, run by promtool over raw series: the values
    the canned test above feeds in, one series per process (the trainer and the rollout
    worker publish one host:port on two nodes and stay two)."""
    promtool = shutil.which("promtool") or pytest.fail("promtool is not on PATH")

    def labels(role, rank, node, **extra):
        d = dict(_proc(role, rank, node), instance="10.0.0.1:9000", **extra)
        return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"
    trainer, r0 = labels("trainer", "0", "n1"), labels("rollout", "0", "n2")
    t_send, r_recv = labels("trainer", "0", "n1", side="send"), labels("rollout", "0", "n2",
                                                                       side="receive")
    # Per minute, linear from 0, so each rate() is the increment / 60.
    series = {
        f"{SYNC}_sum{t_send}": "0+210x10", f"{SYNC}_count{t_send}": "0+60x10",  # 3.5 s
        f"{names.WEIGHTS_TRANSFERRED_SERIES}{t_send}": "0+420000000000x10",  # 7e9 B/s
        f"{names.WEIGHTS_VERSION_SERIES}{t_send}": "0+2x10",
        f"{names.STEP_DURATION_SERIES}_sum{trainer}": "0+2400x10",  # 40 s/s
        f"{names.STEP_WEIGHT_SYNC_SERIES}{trainer}": "0+420x10",  # 7 s/s
        f"{SYNC}_sum{r_recv}": "0+150x10", f"{SYNC}_count{r_recv}": "0+60x10",  # 2.5 s
        f"{names.WEIGHTS_TRANSFERRED_SERIES}{r_recv}": "0+240000000000x10",  # 4e9 B/s
        f"{names.WEIGHTS_VERSION_SERIES}{r_recv}": "0+2x10",
        f"{names.STEP_DURATION_SERIES}_sum{r0}": "0+2400x10",  # no weight sync in its steps
        f"{names.WEIGHTS_CHECKED_SERIES}{r0}": "0+40x10",  # 200 in the 5m window
        f"{names.WEIGHTS_MISMATCHED_SERIES}{labels('rollout', '0', 'n2', reason='value')}":
            "0x7 3x3",  # 3 at 8m
        f"{names.WEIGHTS_MISMATCHED_SERIES}{labels('rollout', '0', 'n2', reason='missing')}":
            "_x8 2x2",  # born at 9m with 2: counted whole
    }

    def sample(lab: str, value: float) -> dict:
        return {"labels": lab, "value": value}
    expected = {
        weights.SIDE_QUERIES["mean_s"]: [sample(t_send, 3.5), sample(r_recv, 2.5)],
        weights.SIDE_QUERIES["bytes_per_s"]: [sample(t_send, 2e9), sample(r_recv, 1.6e9)],
        weights.PROCESS_QUERIES["step_share"]: [sample(trainer, 0.175)],
        weights.PROCESS_QUERIES["checked"]: [sample(r0, 200)],
        weights.MISMATCHED: [sample(labels("rollout", "0", "n2", reason="value"), 3),
                             sample(labels("rollout", "0", "n2", reason="missing"), 2)],
    }
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        # promtool compares floats exactly and a ratio of rates may be an ulp off (2.5 read
        # 2.5000000000000004): rounded to 1e-3, k / 1000 parses as the literal expected does
        "promql_expr_test": [{"expr": f"round({e}, 0.001)", "eval_time": "10m",
                              "exp_samples": s} for e, s in expected.items()]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
