"""The node tier (DESIGN.md "Scale"): a Prometheus per node in server mode evaluates what can
be evaluated where a process's series are, and the central side adds the nodes' parts up.

What moves to the node, and why the answers stay the same:
- Per-process records (instance:*): every series of a process is on its node, so the node
  evaluates the one-tier rule as written, to the same value; the central side drops the rule
  and receives the series (with `node`, the node Prometheus's external label).
- Partial sums: a job-level `sum by (job, ...)` of per-process rates is the sum over nodes of
  the same sum by (node, job, ...); the node records the part, and the central rule sums the
  parts where the one-tier rule summed the raw rates. Only sums split this way: a median or a
  quantile of a role's processes does not, so the straggler's median and the quantiles stay
  central (reading the nodes' per-process means and bucket parts).
- The families whose every use is a partial (the op duration's and row age's buckets, most
  of a process's series) are not sent at all; everything else is, raw, for the rules and
  panels that read it.

The central file is the one-tier recording file with those substitutions, made on the
generated text (each part's one-tier text must occur in it, or generation fails), so a rule
changed in rules.py changes both layouts alike. tests/mixin/test_node_tier.py holds both
layouts to the same answers in promtool, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import names as n
from .config import Config
from .ray_rules import _sum_rate
from .render import Group, Rule, rule_file
from .rules import (HEADER, OP, PROCESS, STEP, _rate, data_plane_seconds, recording_groups,
                    stepping_seconds)

NODE_GROUP = "dpobs-node"
NODE_RULES = "dpobs-node.rules.yml"
CENTRAL_RULES = "dpobs-central.rules.yml"
ROW_AGE_BUCKET = f"{n.ROW_AGE_SERIES}_bucket"
# The raw families the node does not send (regular expressions over the name): every
# histogram's buckets, 18 series per label set and most of a process's series. No central
# rule or alert reads a raw bucket: the op duration's and row age's are read through the
# node's parts, and nothing reads the others' (step, weight sync, Ray's serialization).
# The dashboards' per-process latency panels do: in this layout they read the node's own
# Prometheus (docs/guides/node-tier.md).
NOT_SENT = ("dpobs_.+_bucket",)
# The buckets the central rules read through parts (the one-tier rules read them raw).
PARTED = (f"{OP}_bucket", ROW_AGE_BUCKET)
# Per-process records the node evaluates as written (the central side receives them).
AT_NODE = (n.INSTANCE_FRAC_OF_STEP, n.INSTANCE_BUSY_FRAC_OF_STEP,
           n.INSTANCE_EXPOSED_FRAC_OF_STEP, n.INSTANCE_OP_MEAN, n.INSTANCE_RAY_MOVED,
           n.INSTANCE_RAY_OWNED_BYTES)


@dataclass(frozen=True)
class Part:
    """A node's part of a job-level sum: `expr(*labels)` is the one-tier text, and
    `expr("node", *labels)` the node's record `name`."""
    name: str
    labels: tuple[str, ...]
    expr: Callable[..., str]

    def one_tier(self) -> str:
        return self.expr(*self.labels)

    def at_node(self) -> str:
        return self.expr("node", *self.labels)

    def central(self, c: Config) -> str:
        return f"sum {c.by(*self.labels)} ({self.name})"


def parts(c: Config) -> list[Part]:
    """Record names: the one-tier record's with `node_` before its level, or, for a part of
    an expression no record holds on its own, a name of the same form."""
    ray = (c.ray_ops,)
    return [
        Part(f"{n.NODE_PART}{n.JOB_OP_LE_BUCKETS}", ("job", "op", "le"),
             lambda *ls: _rate(c, f"{OP}_bucket", *ls)),
        Part(n.NODE_ROW_AGE_BUCKETS, ("job", "op", "le"),
             lambda *ls: _rate(c, ROW_AGE_BUCKET, *ls)),
        Part(f"{n.NODE_PART}{n.JOB_ROLE_OP_SECONDS}", ("job", "role", "op"),
             lambda *ls: data_plane_seconds(c, *ls)),
        Part(n.NODE_STEPPING_SECONDS, ("job",),
             lambda *ls: stepping_seconds(c, *ls)),
        Part(f"{n.NODE_PART}{n.JOB_STEP_SECONDS}", ("job",), lambda *ls: _rate(c, f"{STEP}_sum", *ls)),
        Part(f"{n.NODE_PART}{n.JOB_OP_RATE}", ("job", "op"), lambda *ls: _rate(c, f"{OP}_count", *ls)),
        Part(f"{n.NODE_PART}{n.JOB_OP_METHOD_SECONDS}", ("job", "op", "method"),
             lambda *ls: _sum_rate(c, f"{OP}_sum", *ls, where=ray)),
        Part(f"{n.NODE_PART}{n.JOB_OP_METHOD_DIRECTION_BYTES}", ("job", "op", "method", "direction"),
             lambda *ls: _sum_rate(c, n.TRANSFERRED_SERIES, *ls, where=ray)),
        Part(f"{n.NODE_PART}{n.JOB_OP_METHOD_RAY_DATA}", ("job", "op", "method"),
             lambda *ls: _sum_rate(c, n.RAY_DATA_SERIES, *ls)),
        Part(f"{n.NODE_PART}{n.JOB_OP_METHOD_LOCALITY_RAY_MOVED}",
             ("job", "op", "method", n.RAY_LOCALITY),
             lambda *ls: _sum_rate(c, n.RAY_MOVED_SERIES, *ls)),
    ]


def _one_tier_rules(c: Config) -> list[Rule]:
    return [r for g in recording_groups(c) for r in g.rules]


def used_parts(c: Config) -> list[Part]:
    """The parts some one-tier rule of this Config reads (classic_quantiles=False, e.g.,
    leaves the op buckets' part out); tests/mixin/test_node_tier.py checks that the default
    Config reads every one, so a rule changed under a part does not drop it silently."""
    exprs = [r.body["expr"] for r in _one_tier_rules(c) if "expr" in r.body]
    return [p for p in parts(c) if any(p.one_tier() in e for e in exprs)]


def node_groups(c: Config) -> list[Group]:
    by_record = {r.body.get("record"): r for r in _one_tier_rules(c)}
    rules = [Rule({"record": p.name, "expr": p.at_node()}) for p in used_parts(c)]
    rules[0].why = ("This node's part of a job-level sum (the central side sums the nodes'\n"
                    "parts): grouped by node too, which a node's own series do not carry, so\n"
                    "the part gets it from the external label when it is sent.")
    rules += [by_record[name] for name in AT_NODE]
    return [Group(NODE_GROUP, rules)]


def central_groups(c: Config) -> list[Group]:
    """The one-tier groups, per-process records dropped (the nodes send them) and every
    one-tier text of a part replaced by the sum of the nodes' parts."""
    used = used_parts(c)
    out = []
    for g in recording_groups(c):
        rules = []
        for r in g.rules:
            if r.body.get("record") in AT_NODE:
                continue
            expr = r.body["expr"]
            for p in used:
                expr = expr.replace(p.one_tier(), p.central(c))
            rules.append(Rule(dict(r.body, expr=expr), r.why, r.threshold))
        out.append(Group(g.name, rules, g.interval))
    return out


NODE_HEADER = """\
Node-tier rules for dpobs-otel, generated by `dpobs mixin` from dpobs_otel/mixin/node_tier.py
(do not edit). A Prometheus per node in server mode (prometheus/node.yml, or
`dpobs agent --tier node`) evaluates these over its node's processes and remote-writes the
results to the central side, which loads dpobs-central.rules.yml instead of
dpobs-recording.rules.yml.
"""

CENTRAL_HEADER = """\
Recording rules of the central side of the two-tier layout (a node-tier Prometheus per node
sends its parts): dpobs-recording.rules.yml with per-process records dropped (the nodes
evaluate them) and job-level sums read from the nodes' parts. Load this or
dpobs-recording.rules.yml, never both; the alerts file is the same for both layouts.

""" + HEADER.split("\n\n", 1)[1]


def node_file(c: Config) -> str:
    return rule_file(NODE_HEADER, node_groups(c))


def central_file(c: Config) -> str:
    return rule_file(CENTRAL_HEADER, central_groups(c))
