"""tel.step_metrics(): per-step deltas of the same aggregates the instruments export, for
loggers such as wandb or TensorBoard. Keys are stable and namespaced under `dpobs/`."""
from __future__ import annotations

from .stats import Stats

MB = 1e6


class StepMetrics:
    def __init__(self, stats: Stats):
        self._stats = stats
        self._prev: dict[str, float] = {}

    def _snapshot(self) -> dict[str, float]:
        st = self._stats
        snap: dict[str, float] = {}
        with st.lock:
            snap["step_s"] = st.step_seconds
            snap["steps"] = st.steps
            for op, s in st.ops.items():
                snap[f"op/{op}/seconds"] = s.seconds
                snap[f"op/{op}/calls"] = s.calls
                snap[f"op/{op}/errors"] = s.errors
                snap[f"op/{op}/mb"] = (s.read_bytes + s.write_bytes) / MB
                snap[f"max/{op}"] = s.window_max
                s.window_max = 0.0  # a maximum cannot be differenced: the reader resets it
            for stage, sec in st.codec_seconds.items():
                snap[f"codec/{stage}_s"] = sec
            snap["instrumentation_s"] = sum(st.instr_seconds.values())
        return snap

    def collect(self) -> dict[str, float]:
        now = self._snapshot()
        prev, self._prev = self._prev, now
        d = {k: v - prev.get(k, 0) for k, v in now.items() if not k.startswith("max/")}
        ops = sorted(k.split("/")[1] for k in now if k.startswith("op/") and k.endswith("/calls"))
        dp = sum(d[f"op/{op}/seconds"] for op in ops)
        out = {"dpobs/step_s": d["step_s"], "dpobs/steps": d["steps"], "dpobs/data_plane_s": dp}
        if d["step_s"] > 0:
            out["dpobs/frac_of_step"] = dp / d["step_s"]
        for op in ops:
            p = f"dpobs/op/{op}/"
            out[p + "seconds"] = d[f"op/{op}/seconds"]
            out[p + "calls"] = d[f"op/{op}/calls"]
            out[p + "errors"] = d[f"op/{op}/errors"]
            out[p + "share"] = d[f"op/{op}/seconds"] / dp if dp > 0 else 0.0
            out[p + "max_latency_s"] = now[f"max/{op}"]
            out[p + "mb"] = d[f"op/{op}/mb"]
        for key in now:
            if key.startswith("codec/"):
                out["dpobs/" + key] = d[key]
        size, _ = self._stats.outstanding()
        out["dpobs/outstanding_mb"] = size / MB
        out["dpobs/instrumentation_s"] = d["instrumentation_s"]
        out["dpobs/instrumentation_frac"] = d["instrumentation_s"] / dp if dp > 0 else 0.0
        return out
