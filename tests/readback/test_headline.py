"""The one-line verdict (readback/headline.py) from known numbers: the sentence, the op and
the process it names, the job's sums from a window of processes, the recording rules read."""
from __future__ import annotations

from dpobs_otel import names
from dpobs_otel.readback.headline import Numbers, from_deltas, from_parts, from_rules, sentence
from dpobs_otel.readback.scrape import OpTotals, ProcessTotals


def test_the_sentence_says_every_number():
    n = Numbers(0.123, 0.045, "get", "trainer 1", 2048, 3)
    assert sentence(n) == ("data plane 12.3% of the step (exposed 4.5%), most in get on "
                           "trainer 1; guard: checked 2048 rows, mismatched 3")


def test_what_is_not_known_is_said_not_made_up():
    assert sentence(Numbers()) == "data plane: no step measured yet; guard: off"
    assert sentence(Numbers(0.5, None, "put", None, 10, None)) == (
        "data plane 50.0% of the step (exposed -), most in put; guard: checked 10 rows, "
        "mismatched 0")


def test_the_largest_op_and_process_are_named_ties_by_name():
    n = from_parts(0.2, 0.1, {"put": 0.3, "get": 0.6, "clear": 0.1},
                   {"trainer 0": 0.2, "trainer 1": 0.4, "rollout 0": None}, None, None)
    assert (n.op, n.process) == ("get", "trainer 1")
    assert from_parts(None, None, {"b": 0.5, "a": 0.5}, {}, None, None).op == "a"
    assert from_parts(None, None, {"put": 0.0}, {"x": float("nan")}, None, None).op is None


def _proc(step_s: float, exposed_s: float, ops: dict[str, float], guard=None) -> ProcessTotals:
    return ProcessTotals(ops={op: OpTotals(calls=1, seconds=s) for op, s in ops.items()},
                         steps=1, step_seconds=step_s, exposed_seconds=exposed_s, guard=guard)


def test_a_window_of_processes_sums_as_the_rules_do():
    deltas = [({"role": "trainer", "rank": "0"},
               _proc(10.0, 1.0, {"get": 2.0, "put": 1.0}, {"rows_checked": 8.0,
                                                           "rows_mismatched": 1.0})),
              ({"role": "trainer", "rank": "1"}, _proc(10.0, 3.0, {"get": 4.0})),
              ({"role": "rollout", "rank": "0"}, _proc(0.0, 0.0, {"put": 6.0}))]  # no steps
    n = from_deltas(deltas)
    # op-seconds of every process over step seconds of all: (2 + 1 + 4 + 6) / 20
    assert n.frac == 13.0 / 20 and n.exposed == 4.0 / 20
    # put 7 s against get 6 s; trainer 1 spends 40% of its step in ops, trainer 0 30%, the
    # rollout (no steps) has no fraction
    assert (n.op, n.process) == ("put", "trainer 1")
    assert (n.checked, n.mismatched) == (8.0, 1.0)
    assert from_deltas([deltas[1]]).checked is None  # no process guards: "guard: off"


class CannedProm:
    def __init__(self, series: dict[str, list[tuple[dict, float]]]):
        self.series, self.asked = series, []

    def query(self, expr: str) -> list[dict]:
        self.asked.append(expr)
        return [{"metric": m, "value": v} for m, v in self.series.get(expr, [])]


def test_from_the_recording_rules_of_one_job():
    sel = '{job="j"}'
    prom = CannedProm({
        names.JOB_FRAC_OF_STEP + sel: [({"job": "j"}, 0.25)],
        names.JOB_EXPOSED_FRAC_OF_STEP + sel: [({"job": "j"}, 0.05)],
        names.JOB_OP_SHARE + sel: [({"op": "get"}, 0.7), ({"op": "put"}, 0.3)],
        names.INSTANCE_FRAC_OF_STEP + sel: [({"role": "trainer", "rank": "2"}, 0.4),
                                            ({"role": "trainer", "rank": "0"}, 0.1)],
        names.JOB_GUARD_CHECKED + sel: [({"job": "j"}, 64.0)],
        names.JOB_GUARD_MISMATCHED + sel: [({"job": "j"}, 0.0)]})
    assert sentence(from_rules(prom, "j")) == (
        "data plane 25.0% of the step (exposed 5.0%), most in get on trainer 2; guard: "
        "checked 64 rows, mismatched 0")
    assert all(e.endswith(sel) for e in prom.asked)
