"""The one-line verdict at the top of `dpobs top`'s frame, per job, from the numbers the
frame already shows (known answers, no source)."""
from __future__ import annotations

from helpers.top import text

from dpobs_otel.top.model import Answers, Job, Op, Process


def test_each_job_s_verdict_is_the_line_under_the_header():
    a = Answers("canned", 300.0, 0.0, jobs=[
        Job("grpo", frac_of_step=0.25, exposed_frac=0.05, guard_checked=96,
            guard_mismatched=2, ops=[Op("get", share=0.7), Op("put", share=0.3)])],
        processes=[Process("grpo", "h:1", role="trainer", rank="1", frac_of_step=0.4),
                   Process("grpo", "h:2", role="trainer", rank="0", frac_of_step=0.1),
                   Process("other", "h:3", role="trainer", rank="9", frac_of_step=0.9)])
    shown = text(a).splitlines()
    assert shown[1] == ("grpo: data plane 25.0% of the step (exposed 5.0%), most in get on "
                        "trainer 1; guard: checked 96 rows, mismatched 2")
