"""`dpobs top`'s who-waits-for-whom line from the file_sd source (synthetic scrapes, the
window's counter changes worked out here) and from a Prometheus (canned raw series)."""
from __future__ import annotations

from dpobs_otel import names
from dpobs_otel.readback import scrape
from dpobs_otel.top import direct
from dpobs_otel.top.prometheus import RulesSource
from dpobs_otel.top.view import queue_text

JOB = "q"


def body(steps, step_s, busy, exposed, age_s, aged, puts=0, outstanding=0) -> str:
    return "\n".join([
        f"{names.STEP_DURATION_SERIES}_count {steps}", f"{names.STEP_DURATION_SERIES}_sum {step_s}",
        f"{names.STEP_BUSY_SERIES} {busy}", f"{names.STEP_EXPOSED_SERIES} {exposed}",
        f'{names.ROW_AGE_SERIES}_sum{{op="get"}} {age_s}',
        f'{names.ROW_AGE_SERIES}_count{{op="get"}} {aged}',
        f'{names.OP_DURATION_SERIES}_count{{op="put"}} {puts}',
        f'{names.OP_DURATION_SERIES}_sum{{op="put"}} {puts * 0.01}',
        f"{names.OUTSTANDING_KEYS_SERIES} {outstanding}"]) + "\n"


def test_file_sd_source_says_consumer_bound(monkeypatch, tmp_path):
    # Over the 10 s window: two trainers of 10 steps in 5 s each, exposed = busy (their own
    # reads only), 80 rows aged 1.5 s in all: 3 steps of 0.5 s. The rollout puts 10 times.
    roles = {0: "rollout", 1: "trainer", 2: "trainer"}
    before = {0: body(5, 5, 0.1, 0.1, 0, 0, 5, 64), 1: body(5, 2.5, 0.5, 0.5, 40, 40),
              2: body(5, 2.5, 0.5, 0.5, 40, 40)}
    after = {0: body(15, 15, 0.3, 0.3, 0, 0, 15, 64), 1: body(15, 7.5, 1.0, 1.0, 100, 80),
             2: body(15, 7.5, 1.0, 1.0, 100, 80)}
    targets = [scrape.Target(f"h{r}:9000", (("job", JOB), ("rank", str(r)), ("role", roles[r])))
               for r in roles]
    clock = {"t": 1000.0, "bodies": before}
    monkeypatch.setattr(direct.scrape, "targets", lambda sd, job=None: targets)
    monkeypatch.setattr(direct.scrape, "scrape_all", lambda listed, **kw: {
        t: scrape.parse(clock["bodies"][int(t.label("rank"))], clock["t"]) for t in listed})
    src = direct.DirectSource(str(tmp_path))
    src.answers()
    clock["t"], clock["bodies"] = 1010.0, after
    (job,) = src.answers().jobs
    assert job.queue.startswith("consumer-bound: rows age 3.00 consumer steps"), job.queue
    assert queue_text(src.answers()).plain.startswith(f"Who waits for whom: {JOB}: consumer")


def test_prometheus_source_says_producer_bound(monkeypatch):
    # Rates per second: two trainers stepping 1 s/s, exposed 0.9, busy 0.1 (0.8 waiting for
    # rows), 2 steps/s; rows aged 0.05 s each, 20 rows/s: 0.1 steps.
    trainer = {"job": JOB, "role": "trainer", "node": "", "instance": ""}
    rates = {f"{names.STEP_DURATION_SERIES}_sum": 1.0, f"{names.STEP_DURATION_SERIES}_count": 2,
             names.STEP_EXPOSED_SERIES: 0.9, names.STEP_BUSY_SERIES: 0.1,
             f"{names.ROW_AGE_SERIES}_sum": 1.0, f"{names.ROW_AGE_SERIES}_count": 20}

    def query(self, expr):
        for name, v in rates.items():
            if f"({name}[" in expr or expr.endswith(f"({name})"):
                return [(dict(trainer, instance=f"t{i}:9"), v) for i in range(2)]
        return []
    monkeypatch.setattr(RulesSource, "query", query)
    monkeypatch.setattr(RulesSource, "_alerts", lambda self: [])
    (job,) = RulesSource("http://127.0.0.1:9").answers().jobs
    assert job.queue.startswith("producer-bound: consumers wait for rows 80% of their steps, "
                                "then read them 0.10 steps"), job.queue
