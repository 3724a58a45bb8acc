"""YAML as the mixin writes it: deterministic (a test diffs the output with the repository),
multi-line strings (PromQL) as literal blocks so a file reads like hand-written rules, and
rule files that keep a comment above each rule saying why it is written that way."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml


class _Dumper(yaml.SafeDumper):
    """Literal blocks for multi-line strings; no aliases (every rule stands alone)."""

    def ignore_aliases(self, data):
        return True


_Dumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def dump(doc, sort_keys: bool = False) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=sort_keys, width=4096,
                     default_flow_style=False, allow_unicode=True)


def comment(text: str, indent: str = "") -> str:
    """Each line of `text` as a YAML comment line (empty lines kept as bare `#`)."""
    return "".join(f"{indent}# {line}".rstrip() + "\n" for line in text.strip("\n").split("\n"))


def sections(*parts: tuple[str, dict]) -> str:
    """A YAML document of top-level keys in order, each part under its comment."""
    return "".join((comment(why) if why else "") + dump(body) for why, body in parts)


def _indent(text: str, by: str) -> str:
    return "".join(by + line if line.strip() else line for line in text.splitlines(True))


@dataclass
class Rule:
    """One recording or alerting rule, the comment written above it, and for an alert the
    comparison that decides it (e.g. ">0.25"), which the alerts file's table shows."""
    body: dict
    why: str = ""
    threshold: str = ""


def alert(c, name: str, severity: str, expr: str, for_: str | None, summary: str,
          description: str, why: str = "", threshold: str = ">0") -> Rule:
    """An alerting rule of the mixin's form: severity label, the three annotations (its
    runbook_url from `c`, the Config), and `threshold` for the alerts file's table."""
    body = {"alert": name, "expr": expr}
    if for_:
        body["for"] = for_
    body["labels"] = {"severity": severity}
    body["annotations"] = {"summary": summary, "description": description,
                           "runbook_url": c.runbook_url(name)}
    return Rule(body, why, threshold)


@dataclass
class Group:
    name: str
    rules: list[Rule] = field(default_factory=list)
    interval: str | None = None

    def as_dict(self) -> dict:
        out = {"name": self.name}
        if self.interval:
            out["interval"] = self.interval
        return out | {"rules": [r.body for r in self.rules]}


def rule_file(header: str, groups: list[Group]) -> str:
    """A Prometheus rule file: `header` as comments, then the groups, each rule preceded
    by its comment."""
    out = [comment(header), "groups:\n"]
    for g in groups:
        head = {k: v for k, v in g.as_dict().items() if k != "rules"}
        out.append(_indent(dump([head]), "  ").rstrip("\n") + "\n    rules:\n")
        for r in g.rules:
            if r.why:
                out.append(comment(r.why, " " * 6))
            out.append(_indent(dump([r.body]), " " * 6))
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def write_files(out: Path, files: dict[str, str]) -> None:
    """Write each relative path under `out` and print it (the commands' output)."""
    for rel, text in sorted(files.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
