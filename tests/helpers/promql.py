"""A small PromQL tokenizer for the mixin tests: enough to tell metric names from functions
and labels, and to read the operand a comparison compares with."""
from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},])
  | (?P<ws>\s+)""", re.X)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset"} | GROUPING
COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
# What may follow a comparison's right operand without binding tighter than the comparison
# (PromQL: ^ * / % + - bind tighter; comparisons, and, unless, or looser or equal).
_ENDS_OPERAND = {None, ")", "}", ",", "and", "or", "unless"} | COMPARISONS


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize {expr[pos:]!r} in {expr!r}")
        if m.lastgroup != "ws":
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    return tokens


def metric_names(expr: str) -> set[str]:
    """Identifiers that name series: not functions or aggregations (followed by `(` or
    by/without), not keywords, not label names inside `{}` or in a by/on(...) list."""
    tokens, names, depth, i = tokenize(expr), set(), 0, 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
        elif kind == "ident" and depth == 0:
            if text in GROUPING and nxt == "(":
                i = [t for _, t in tokens].index(")", i)  # skip the label list
            elif text not in KEYWORDS and nxt not in ("(", "by", "without"):  # not sum by
                names.add(text)
        i += 1
    return names


def literal_comparisons(expr: str) -> list[tuple[str, float]]:
    """(operator, number) for every comparison whose whole right operand is a number
    literal: in `x > 0.25 * 2` the operand is 0.5, so it is not (">", 0.25)."""
    tokens = tokenize(expr)
    out, depth = [], 0
    for i, (kind, text) in enumerate(tokens):
        depth += {"{": 1, "}": -1}.get(text, 0)
        if kind != "op" or text not in COMPARISONS or depth:
            continue  # label matchers (`=`, `!=` inside {}) are not comparisons
        j = i + 1 + (tokens[i + 1][1] == "bool" if i + 1 < len(tokens) else 0)
        if j < len(tokens) and tokens[j][0] == "num":
            after = tokens[j + 1][1] if j + 1 < len(tokens) else None
            if after in _ENDS_OPERAND:
                out.append((text, float(tokens[j][1])))
    return out
