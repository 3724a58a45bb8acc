"""`dpobs top`'s busy and exposed fractions and its stragglers, from both sources: the
file_sd source from synthetic scrapes (no endpoint needed: the counters are written out as a
process serves them), the Prometheus source from canned rule series. Expected values are
worked out here from the schedules."""
from __future__ import annotations

import pytest

from dpobs_otel import names
from dpobs_otel.readback import scrape
from dpobs_otel.top import direct
from dpobs_otel.top.prometheus import TARGETS
from dpobs_otel.top.model import stragglers
from helpers.top import Canned, number, table, text

JOB = "j"


def test_stragglers_follow_the_alert_rule():
    def proc(role, rank, mean, op="get", job=JOB):
        return ({"job": job, "role": role, "rank": str(rank), "node": f"n{rank}",
                 "instance": f"{role}{rank}:9", "op": op}, mean)
    means = [proc("trainer", 0, 0.1), proc("trainer", 1, 0.12), proc("trainer", 2, 0.3),
             proc("trainer", 0, 0.01, "put"), proc("trainer", 1, 0.01, "put"),
             proc("trainer", 2, 0.01, "put"),                       # equal: nobody
             proc("rollout", 0, 0.1), proc("rollout", 1, 0.9),      # two: no role
             proc("ref", 0, 0.1), proc("ref", 1, 0.1), proc("ref", 2, 0.3),
             proc("ref", 3, 0.5)]                                   # median (0.1 + 0.3) / 2
    got = [(s.role, s.rank, s.op, round(s.ratio, 9), s.median_s) for s in stragglers(means)]
    assert got == [("ref", "3", "get", 2.5, pytest.approx(0.2)),
                   ("trainer", "2", "get", 2.5, 0.12)]
    # ref rank 2 is 0.3 / 0.2 = 1.5x: named at a factor of 1.4
    assert {(s.role, s.rank) for s in stragglers(means, factor=1.4)} == {
        ("ref", "3"), ("ref", "2"), ("trainer", "2")}
    assert [s.rank for s in stragglers(means, min_processes=4)] == ["3"]


def body(steps, step_s, get_s, gets, busy, exposed):
    return "\n".join([
        f"{names.STEP_DURATION_SERIES}_count {steps}",
        f"{names.STEP_DURATION_SERIES}_sum {step_s}",
        f'{names.OP_DURATION_SERIES}_count{{op="get"}} {gets}',
        f'{names.OP_DURATION_SERIES}_sum{{op="get"}} {get_s}',
        f"{names.STEP_BUSY_SERIES} {busy}", f"{names.STEP_EXPOSED_SERIES} {exposed}"]) + "\n"


def test_file_sd_source_computes_busy_exposed_and_names_the_straggler(monkeypatch, tmp_path):
    # Three trainers, two scrapes 10 s apart. Changes between them, per process:
    #            step s  get s  gets  busy  exposed
    #   rank 0     8      2     20    1.6    0.4     mean get 0.1 s
    #   rank 1     8      2.4   20    2.0    0.8     mean get 0.12 s
    #   rank 2     8      6     20    4.0    2.4     mean get 0.3 s: 2.5x the median 0.12
    first = {0: (4, 4.0, 1.0, 10, 1.0, 0.5), 1: (4, 4.0, 1.2, 10, 1.0, 0.2),
             2: (4, 4.0, 3.0, 10, 2.0, 0.6)}
    change = {0: (4, 8.0, 2.0, 20, 1.6, 0.4), 1: (4, 8.0, 2.4, 20, 2.0, 0.8),
              2: (4, 8.0, 6.0, 20, 4.0, 2.4)}
    targets = [scrape.Target(f"h{r}:9000", (("job", JOB), ("rank", str(r)), ("role", "trainer")))
               for r in range(3)]
    clock = {"t": 1000.0, "values": first}

    def scrape_all(listed, **kw):
        return {t: scrape.parse(body(*clock["values"][int(t.label("rank"))]), clock["t"])
                for t in listed}
    monkeypatch.setattr(direct.scrape, "targets", lambda sd, job=None: targets)
    monkeypatch.setattr(direct.scrape, "scrape_all", scrape_all)
    src = direct.DirectSource(str(tmp_path))
    src.answers()
    clock["t"] += 10.0
    clock["values"] = {r: tuple(a + b for a, b in zip(first[r], change[r])) for r in first}
    a = src.answers()

    procs = {p.rank: p for p in a.processes}
    for r, (_, step, get, _, busy, exposed) in change.items():
        assert procs[str(r)].frac_of_step == pytest.approx(get / step)
        assert procs[str(r)].busy_frac == pytest.approx(busy / step)
        assert procs[str(r)].exposed_frac == pytest.approx(exposed / step)
    (job,) = a.jobs
    assert job.busy_frac == pytest.approx((1.6 + 2.0 + 4.0) / 24)
    assert job.exposed_frac == pytest.approx((0.4 + 0.8 + 2.4) / 24)
    assert job.max_exposed_frac == pytest.approx(2.4 / 8)
    (s,) = a.stragglers
    assert (s.rank, s.instance, s.op) == ("2", "h2:9000", "get")
    assert (s.mean_s, s.median_s) == (pytest.approx(0.3), pytest.approx(0.12))

    shown = text(a)
    (row,) = table(shown, "Jobs")
    assert number(row["busy"]) == pytest.approx(0.317, abs=5e-4)  # 7.6 / 24, shown to 0.1%
    assert number(row["exposed"]) == pytest.approx(0.15, abs=5e-4)
    assert number(row["most stalled"]) == pytest.approx(0.3, abs=5e-4)
    (straggler,) = table(shown, "Stragglers")
    assert (straggler["instance"], straggler["op"], straggler["x"]) == ("h2:9000", "get", "2.50")
    by_rank = {r["rank"]: r for r in table(shown, "Processes")}
    assert number(by_rank["1"]["exposed"]) == pytest.approx(0.1, abs=5e-4)



def test_prometheus_source_reads_the_rules_and_names_the_straggler():
    def proc(rank):
        return {"job": JOB, "node": f"n{rank}", "instance": f"h{rank}:9000",
                "role": "trainer", "rank": str(rank)}
    src = Canned({
        TARGETS: [(proc(r), 1.0) for r in range(3)],
        names.INSTANCE_BUSY_FRAC_OF_STEP: [(proc(0), 0.5), (proc(1), 0.25), (proc(2), 0.75)],
        names.INSTANCE_EXPOSED_FRAC_OF_STEP: [(proc(0), 0.125), (proc(1), 0.0),
                                              (proc(2), 0.5)],
        names.JOB_BUSY_FRAC_OF_STEP: [({"job": JOB}, 0.5)],
        names.JOB_EXPOSED_FRAC_OF_STEP: [({"job": JOB}, 0.2)],
        names.JOB_MAX_EXPOSED_FRAC_OF_STEP: [({"job": JOB}, 0.5)],
        names.INSTANCE_OP_MEAN: [(dict(proc(r), op="get"), m)
                                 for r, m in enumerate((0.1, 0.12, 0.3))],
    })
    a = src.answers()
    assert not a.error
    procs = {p.rank: p for p in a.processes}
    assert [(procs[r].busy_frac, procs[r].exposed_frac) for r in "012"] == [
        (0.5, 0.125), (0.25, 0.0), (0.75, 0.5)]
    (job,) = a.jobs
    assert (job.busy_frac, job.exposed_frac, job.max_exposed_frac) == (0.5, 0.2, 0.5)
    (s,) = a.stragglers
    assert (s.node, s.instance, s.rank, s.op) == ("n2", "h2:9000", "2", "get")
