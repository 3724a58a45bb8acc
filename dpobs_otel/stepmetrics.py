"""tel.step_metrics(): per-step deltas of the same aggregates the instruments export, for
loggers such as wandb or TensorBoard. Keys are namespaced under `dpobs/`.

Which keys can be absent (README, "Per-step metrics"): `dpobs/frac_of_step` in a window
with no completed step (a fraction of nothing is undefined, not 0); `dpobs/op/<op>/...`
until the op is first used (from then on every window carries it, 0 when idle);
`dpobs/busy_frac` and `dpobs/exposed_frac` like frac_of_step (over step time);
`dpobs/codec/<stage>_s` until the stage is first timed; `dpobs/weights/...` until the
process first completes a weight sync (then its mb_per_s in a window that synced nothing,
its frac_of_step like frac_of_step); `dpobs/guard/...` whenever the
guard is off; `dpobs/row_age/...` whenever row age is off, and its mean_s and max_s in a
window that aged no row. Every other key is in every dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .stats import Stats

MB = 1e6


@dataclass
class _Snapshot:
    step_s: float = 0.0
    steps: int = 0
    busy_s: float = 0.0  # critical.py: time on the critical path
    exposed_s: float = 0.0
    instrumentation_s: float = 0.0
    # op -> (seconds, calls, errors, bytes either way)
    ops: dict[str, tuple[float, int, int, int]] = field(default_factory=dict)
    max_s: dict[str, float] = field(default_factory=dict)
    codec: dict[str, float] = field(default_factory=dict)
    guard: dict[str, float] = field(default_factory=dict)
    weights: dict = field(default_factory=dict)  # weights/meter.py WeightStats.snapshot()
    # op -> data seconds of the accounts kept beside the core's (Ray's: a Ray op's
    # moving-data part, never its wait for a producer)
    data: dict[str, float] = field(default_factory=dict)


class StepMetrics:
    def __init__(self, stats: Stats, critical, guard=None, row_age=None, weights=None):
        self._stats = stats
        self._weights = weights
        self._critical = critical
        self._guard = guard
        self._row_age = row_age
        self._prev = _Snapshot()

    def _snapshot(self) -> _Snapshot:
        st = self._stats
        snap = _Snapshot()
        with st.lock:
            snap.step_s, snap.steps = st.step_seconds, st.steps
            for op, s in st.ops.items():
                snap.ops[op] = (s.seconds, s.calls, s.errors, s.read_bytes + s.write_bytes)
                snap.max_s[op] = s.window_max
                s.window_max = 0.0  # a maximum cannot be differenced: the reader resets it
            snap.codec = dict(st.codec_seconds)
            snap.instrumentation_s = sum(st.instr_seconds.values())
        for account in st.accounts:
            for op, seconds in account.data_seconds().items():
                snap.data[op] = snap.data.get(op, 0.0) + seconds
        snap.busy_s, snap.exposed_s = self._critical.totals()
        if self._guard is not None:
            snap.guard = guard_flat(self._guard.totals())
        if self._weights is not None:
            snap.weights = self._weights.stats()
        return snap

    def collect(self) -> dict[str, float]:
        now = self._snapshot()
        prev, self._prev = self._prev, now
        step_s = now.step_s - prev.step_s
        deltas = {op: [a - b for a, b in zip(v, prev.ops.get(op, (0, 0, 0, 0)))]
                  for op, v in now.ops.items()}
        data = {op: v - prev.data.get(op, 0.0) for op, v in now.data.items()}
        dp = sum(d[0] for d in deltas.values()) + sum(data.values())
        out = {"dpobs/step_s": step_s, "dpobs/steps": now.steps - prev.steps,
               "dpobs/data_plane_s": dp}
        busy, exposed = now.busy_s - prev.busy_s, now.exposed_s - prev.exposed_s
        out["dpobs/busy_s"], out["dpobs/exposed_s"] = busy, exposed
        if step_s > 0:
            out["dpobs/frac_of_step"] = dp / step_s
            out["dpobs/busy_frac"] = busy / step_s
            out["dpobs/exposed_frac"] = exposed / step_s
        for op in sorted(deltas):
            seconds, calls, errors, nbytes = deltas[op]
            p = f"dpobs/op/{op}/"
            out[p + "seconds"] = seconds
            out[p + "calls"] = calls
            out[p + "errors"] = errors
            out[p + "share"] = seconds / dp if dp > 0 else 0.0
            out[p + "max_latency_s"] = now.max_s[op]
            out[p + "mb"] = nbytes / MB
        for op in sorted(data):  # Ray's ops: the share of their data seconds
            out[f"dpobs/ray/{op}/share"] = data[op] / dp if dp > 0 else 0.0
        for stage, sec in now.codec.items():
            out[f"dpobs/codec/{stage}_s"] = sec - prev.codec.get(stage, 0.0)
        for key, v in now.guard.items():
            out[f"dpobs/guard/{key}"] = v - prev.guard.get(key, 0)
        if now.weights.get("syncs"):
            out.update(weights_window(now.weights, prev.weights, step_s))
        if self._row_age is not None:  # row age (rowage.py): its own window, reset here
            out.update(self._row_age.window())
        for account in self._stats.accounts:  # Ray's ops: their own keys, their own window
            out.update(account.window())
        size, _ = self._stats.outstanding()
        out["dpobs/outstanding_mb"] = size / MB
        instr = now.instrumentation_s - prev.instrumentation_s
        out["dpobs/instrumentation_s"] = instr
        out["dpobs/instrumentation_frac"] = instr / dp if dp > 0 else 0.0
        return out


def weights_window(now: dict, prev: dict, step_s: float) -> dict[str, float]:
    """dpobs/weights/...: the window's syncs (both sides), their seconds, MB and tensors,
    bandwidth (MB/s over the seconds syncing), tensors checked and mismatched, the sync time
    inside steps and its share of step time, and the newest version synced."""
    d = {k: now[k] - prev.get(k, 0) for k in
         ("syncs", "seconds", "bytes", "tensors", "checked", "mismatched", "step_seconds")}
    p = "dpobs/weights/"
    out = {p + "syncs": d["syncs"], p + "sync_s": d["seconds"], p + "mb": d["bytes"] / MB,
           p + "tensors": d["tensors"], p + "checked": d["checked"],
           p + "mismatched": d["mismatched"], p + "step_s": d["step_seconds"],
           p + "version": now["version"]}
    if d["seconds"] > 0:
        out[p + "mb_per_s"] = d["bytes"] / MB / d["seconds"]
    if step_s > 0:
        out[p + "frac_of_step"] = d["step_seconds"] / step_s
    return out


GUARD_ROWS = ("recorded", "checked", "mismatched", "unverified")


def guard_flat(totals: dict[str, dict[str, int]]) -> dict[str, int]:
    """The guard's cumulative counts as step-dict keys: rows_<kind> summed over fields (every
    kind always present, so a first mismatch is a change from 0), fields_skipped/<reason>,
    failures."""
    out = {f"rows_{kind}": sum(totals.get(kind, {}).values()) for kind in GUARD_ROWS}
    for reason, n in totals.get("skipped", {}).items():
        out[f"fields_skipped/{reason}"] = n
    out["failures"] = sum(totals.get("failures", {}).values())
    return out
