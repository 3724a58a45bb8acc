"""One process's weight syncs (DESIGN.md "Weight sync") as read back from its samples: per
side, the syncs, their seconds and bytes (counters) and the version of the last one (a
gauge); on a receiver with the guard on, the tensors checked and mismatched by reason; and
the seconds of weight sync inside its steps, for a process that syncs inside them.

    w = WeightTotals(); w.add(name, labels, value)  # for each sample; False: not a weight one
    window(prev, now)                               # now - prev, counter by counter

A series a process does not export stays None (or absent from its dict): the exporter
creates a side's series at that side's first sync, the check's at the first receive, and
the step seconds at the first sync inside a step. So None means "not this process's
business", which the readers show as a dash rather than a 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .. import names

SYNC = names.WEIGHTS_SYNC_DURATION_SERIES
_SIDE_COUNTERS = {f"{SYNC}_count": "syncs", f"{SYNC}_sum": "seconds",
                  names.WEIGHTS_TRANSFERRED_SERIES: "bytes"}
SERIES = frozenset((*_SIDE_COUNTERS, names.WEIGHTS_VERSION_SERIES, names.WEIGHTS_CHECKED_SERIES,
                    names.WEIGHTS_MISMATCHED_SERIES, names.STEP_WEIGHT_SYNC_SERIES))
UNUSED = f"{SYNC}_bucket"  # nothing reads the buckets: a scrape may skip them unparsed


@dataclass
class Side:
    syncs: float = 0.0
    seconds: float = 0.0  # wall time, first tensor to last, summed over syncs
    bytes: float = 0.0
    version: float | None = None  # of the last completed sync (a gauge: never differenced)


@dataclass
class WeightTotals:
    sides: dict[str, Side] = field(default_factory=dict)
    checked: float | None = None
    mismatched: dict[str, float] = field(default_factory=dict)  # reason -> tensors
    step_seconds: float | None = None  # sync time inside the process's steps

    def add(self, name: str, labels: dict, value: float) -> bool:
        """Take one sample; False when it is not a weight-sync series."""
        if name in _SIDE_COUNTERS or name == names.WEIGHTS_VERSION_SERIES:
            side = self.sides.setdefault(labels.get("side", ""), Side())
            if name == names.WEIGHTS_VERSION_SERIES:
                side.version = value
            else:
                key = _SIDE_COUNTERS[name]
                setattr(side, key, getattr(side, key) + value)
        elif name == names.WEIGHTS_CHECKED_SERIES:
            self.checked = (self.checked or 0.0) + value
        elif name == names.WEIGHTS_MISMATCHED_SERIES:
            reason = labels.get("reason", "")
            self.mismatched[reason] = self.mismatched.get(reason, 0.0) + value
        elif name == names.STEP_WEIGHT_SYNC_SERIES:
            self.step_seconds = (self.step_seconds or 0.0) + value
        else:
            return False
        return True

    def went_back(self, prev: WeightTotals) -> bool:
        """A counter below its value in `prev`, or a series `prev` had gone: a restart."""
        if set(prev.sides) - set(self.sides) or set(prev.mismatched) - set(self.mismatched):
            return True
        pairs = [(self.checked, prev.checked), (self.step_seconds, prev.step_seconds)]
        pairs += [(self.mismatched[r], v) for r, v in prev.mismatched.items()]
        for side, p in prev.sides.items():
            s = self.sides[side]
            pairs += [(s.syncs, p.syncs), (s.seconds, p.seconds), (s.bytes, p.bytes)]
        return any(b is not None and (a is None or a < b) for a, b in pairs)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None else a - (b or 0.0)


def window(prev: WeightTotals | None, now: WeightTotals | None) -> WeightTotals | None:
    """now - prev, counter by counter (a series born since prev counts whole); versions
    are now's. prev None: since the start. Assumes now follows prev (see went_back)."""
    if prev is None or now is None:
        return now
    sides = {}
    for name, s in now.sides.items():
        p = prev.sides.get(name, Side())
        sides[name] = Side(s.syncs - p.syncs, s.seconds - p.seconds, s.bytes - p.bytes,
                           s.version)
    return WeightTotals(sides, _minus(now.checked, prev.checked),
                        {r: v - prev.mismatched.get(r, 0.0) for r, v in now.mismatched.items()},
                        _minus(now.step_seconds, prev.step_seconds))


def checks_whole(w: WeightTotals | None, whole: WeightTotals | None) -> WeightTotals | None:
    """`w` with the check's counts of `whole`: a process first seen inside the window counts
    every tensor it checked, as the rules count a series born in the window."""
    if w is None or whole is None:
        return w
    return replace(w, checked=whole.checked, mismatched=dict(whole.mismatched))
