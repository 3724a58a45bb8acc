"""The names ../shared/DESIGN.md pins, read from its text (not from our generators), by
category; tests/test_contract.py holds contract.yml to exactly these."""
from __future__ import annotations

import re
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[3] / "shared" / "DESIGN.md"


def _section(text: str, heading: str) -> str:
    """The body of a `## heading` section, up to the next `## `."""
    body = text.split(f"\n## {heading}", 1)[1]
    return body.split("\n## ", 1)[0]


def _expand(name: str) -> list[str]:
    """dpobs_x_{bucket,sum,count} -> the three names; anything else as it is."""
    m = re.fullmatch(r"(\w+?)_\{([\w,]+)\}", name)
    return [f"{m[1]}_{s}" for s in m[2].split(",")] if m else [name]


def series(text: str) -> set[str]:
    """The series of the metrics table and of the Ray section's own rows."""
    table = _section(text, "Metrics (OpenTelemetry instrument -> Prometheus series)") + \
        _section(text, "Ray's object store as a data plane")
    rows = [r for r in table.splitlines() if r.startswith("| ") and "dpobs_" in r]
    return {n for r in rows for n in _expand(r.rstrip(" |").rsplit("|", 1)[1].strip())}


# Sections beside "Recording rules" and "Alerts" that pin rules and alerts of their own: the
# Ray section's (moving data versus waiting) and the monitoring's own (Scale).
RULE_SECTIONS = ("Ray's object store as a data plane", "Scale")


def _with_rule_sections(text: str, heading: str) -> str:
    return "".join(_section(text, h) for h in (heading, *RULE_SECTIONS))


def records(text: str) -> set[str]:
    return set(re.findall(r"^\s{4}([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)",
                          _with_rule_sections(text, "Recording rules"), re.M))


def alerts(text: str) -> set[str]:
    return set(re.findall(r"^\s{4}(Dpobs[A-Za-z]+)\s", _with_rule_sections(text, "Alerts"),
                          re.M))


def commands(text: str) -> set[str]:
    return set(re.findall(r"^\s{4}dpobs ([a-z]+)", _section(text, "Command line (`dpobs`)"), re.M))


def demo_flags(text: str) -> set[str]:
    block = _section(text, "Command line (`dpobs`)").split("dpobs mixin", 1)[0]
    return set(re.findall(r"\[(--[a-z-]+)", block))


def api(text: str) -> set[str]:
    """tel.<method> and start()'s keyword arguments, as `start(name=)`."""
    block = _section(text, "Public API (Python, import dpobs_otel as dpobs)")
    names = {f"tel.{m}" for m in re.findall(r"tel\.([a-z_]+)", block)}
    for args in re.findall(r"dpobs\.start\(([^)]*)\)", block):
        names |= {f"start({k}=)" for k in re.findall(r"\b([a-z_]+)=", args)}
    return names


def modules(text: str) -> set[str]:
    layout = _section(text, "Layout").split("dpobs_otel/", 1)[1].split("\n    dashboards/", 1)[0]
    folders = {f"dpobs_otel.{d}" for d in re.findall(r"^\s{6}([a-z_]+)/", layout, re.M)}
    return folders | set(re.findall(r"(dpobs_otel\.adapters\.[a-z_]+)\.", _section(text, "Adapters")))


def step_keys(text: str) -> set[str]:
    return set(re.findall(r"`(dpobs/[a-z_/]+)`", text))


def cluster_keys(text: str) -> set[str]:
    keys = set()
    for m in re.finditer(r"the cluster view (?:adds )?((?:`[a-z_/]+`[,\sand]*)+)", text):
        keys |= set(re.findall(r"`([a-z_/]+)`", m[1]))
    return keys


def spans(text: str) -> set[str]:
    return set(re.findall(r"`(dpobs\.(?:<op>|step|wait))`", _section(text, "Timeline (tracing)")))


def env(text: str) -> set[str]:
    return set(re.findall(r"\b(DPOBS_[A-Z_]+[A-Z])\b", text))


def dashboards(text: str) -> set[str]:
    return set(re.findall(r"`(dpobs-[a-z]+)`", _section(text, "Dashboards")))


READERS = {"series": series, "records": records, "alerts": alerts, "commands": commands,
           "demo_flags": demo_flags, "api": api, "modules": modules,
           "step_metrics": step_keys, "cluster_view": cluster_keys, "spans": spans,
           "env": env, "dashboards": dashboards}


def names(text: str | None = None) -> dict[str, set[str]]:
    text = DESIGN.read_text() if text is None else text
    return {category: read(text) for category, read in READERS.items()}
