"""The store's own account beside dpobs's (DESIGN.md "Recording rules": the three
job_op:dpobs_store_* records), from TransferQueue's exporter, scraped as the job's
`tq-controller` target (adapters/transferqueue/store_metrics.py registers it).

Per request type (op_type), the store's seconds and requests per second:
- controller requests: its histogram's _sum and its request counter, exact;
- storage requests: each unit publishes the cumulative mean (avg = its histogram's
  sum / count) and the count of each request type, which the controller gathers every
  TQ_METRICS_COLLECT_INTERVAL (10 s by default). avg x ops is therefore the unit's cumulative
  seconds, exact at each collection and up to an interval late: recorded per unit, then
  rated. Requests are the mean unit's (a call sends one to every unit its rows live on), so
  seconds per request type are seconds per call.

Server seconds per op bill each measured op the store's mean seconds of every request its
plain form makes (requests.billed()); a request type the store never served bills nothing.
Coverage counts each op once, by a request every form of it makes exactly once
(requests.COVERAGE); what the measured clients made is their op rate, 0 where none was
measured, so a job whose only writer is unmeasured reads 0, not nothing.
"""
from __future__ import annotations

from .. import names as n
from ..adapters.transferqueue import exporter as tq
from ..adapters.transferqueue.requests import COVERAGE, billed
from .config import Config
from .render import Rule


def _matching(types) -> str:
    return f'{tq.OP_TYPE}=~"{"|".join(types)}"'


def _per_type(c: Config, controller: str, storage: str, storage_by: str) -> str:
    return (f"sum {c.by('job', tq.OP_TYPE)} (rate({controller}[5m]))\n"
            f"  or {storage_by} {c.by('job', tq.OP_TYPE)} (rate({storage}[5m]))\n")


def _server_seconds(c: Config) -> str:
    """Per op: its rate x the sum of the store's mean seconds of the requests it makes."""
    terms = []
    for op, made in billed().items():
        kinds = {**made.controller, **made.storage}
        if set(kinds.values()) != {1}:
            raise ValueError(f"{op}: a request made twice per op needs a weight here: {kinds}")
        terms.append(f'{n.JOB_OP_RATE}{{op="{op}"}}\n    * {c.on("job")} group_left ()\n'
                     f"  sum {c.by('job')} ({n.JOB_OP_TYPE_STORE_MEAN}{{{_matching(kinds)}}})")
    return "\n  or\n".join(terms) + "\n"


def _by_covered_op(c: Config, series) -> str:
    """One series per covered op: `series(ops, types)` relabelled with the covered op."""
    parts = [f'label_replace(\n    {series(ops, types)},\n    "op", "{op}", "", "")'
             for op, (ops, _, types) in COVERAGE.items()]
    return "\n  or\n  ".join(parts) + "\n"


def store_rules(c: Config) -> list[Rule]:
    ctl = (c.sel(f"{tq.CONTROLLER_DURATION}_sum"), c.sel(tq.CONTROLLER_REQUESTS))
    served = _by_covered_op(c, lambda ops, types: (
        f"sum {c.by('job')} ({n.JOB_OP_TYPE_STORE_REQUESTS}{{{_matching(types)}}})"))
    made = _by_covered_op(c, lambda ops, types: (
        f'sum {c.by("job")} ({n.JOB_OP_RATE}{{op=~"{"|".join(ops)}"}})'))
    return [
        Rule({"record": n.UNIT_STORE_SECONDS,
              "expr": f"{c.sel(tq.STORAGE_LATENCY_AVG)} * {c.sel(tq.STORAGE_REQUESTS)}"},
             "TransferQueue's storage units: cumulative mean x cumulative count = each unit's\n"
             "cumulative seconds per request type, exact at each collection (10 s)."),
        Rule({"record": n.JOB_OP_TYPE_STORE_SECONDS,
              "expr": _per_type(c, ctl[0], n.UNIT_STORE_SECONDS, "sum")}),
        Rule({"record": n.JOB_OP_TYPE_STORE_REQUESTS,
              "expr": _per_type(c, ctl[1], c.sel(tq.STORAGE_REQUESTS), "avg")},
             "Storage: the mean unit's requests, one per call (a call reaches every unit\n"
             "its rows live on)."),
        Rule({"record": n.JOB_OP_TYPE_STORE_MEAN,
              "expr": f"{n.JOB_OP_TYPE_STORE_SECONDS}\n  / ({n.JOB_OP_TYPE_STORE_REQUESTS} > 0)\n"}),
        Rule({"record": n.JOB_OP_STORE_SERVER_SECONDS, "expr": _server_seconds(c)},
             "The store's seconds for the requests the measured ops made: each op's rate x the\n"
             "requests its plain form makes x the store's mean seconds for each."),
        Rule({"record": n.JOB_OP_STORE_SERVER_SHARE,
              "expr": f"{n.JOB_OP_STORE_SERVER_SECONDS}\n"
                      f"  / {c.on('job', 'op')} ({n.JOB_OP_SECONDS} > 0)\n"},
             "Above 1 where storage units serve one call in parallel (seconds of work, not\n"
             "of waiting)."),
        Rule({"record": n.JOB_OP_STORE_SERVED, "expr": served},
             "Coverage: each covered op once, by a request only it makes (requests.COVERAGE)."),
        Rule({"record": n.JOB_OP_STORE_MADE,
              "expr": f"(\n  {made.rstrip()}\n)\n  and {c.on('job', 'op')} {n.JOB_OP_STORE_SERVED}\n"
                      f"  or {n.JOB_OP_STORE_SERVED} * 0\n"},
             "Only where the store's account is scraped; 0 where no client of an op is measured."),
        Rule({"record": n.JOB_OP_STORE_COVERAGE,
              "expr": f"{n.JOB_OP_STORE_MADE}\n  / {c.on('job', 'op')} ({n.JOB_OP_STORE_SERVED} > 0)\n"},
             f"{n.ALERT_UNMEASURED_CLIENTS} reads this."),
        Rule({"record": n.JOB_STORE_COVERAGE,
              "expr": f"sum {c.by('job')} ({n.JOB_OP_STORE_MADE})\n"
                      f"  / (sum {c.by('job')} ({n.JOB_OP_STORE_SERVED}) > 0)\n"}),
    ]
