"""The timeline as a PNG (matplotlib, the extra `timeline`): one lane per process, ops
coloured by op (weight syncs hatched in their own colour), the process's steps as a strip above its ops with their boundaries, exposed
waits hatched below, a legend and a time axis. Sized by the number of lanes, so 8 and 32
processes both stay readable."""
from __future__ import annotations

from .events import Process, origin_ns

EXTRA = "dpobs-otel[timeline]"
STEP_Y, OP_Y, WAIT_Y = (0.10, 0.16), (0.30, 0.40), (0.74, 0.16)  # (offset, height) in a lane
WAIT_COLOR = "#d62728"
WEIGHTS_COLOR = "#6a3d9a"  # a weight sync: drawn in the ops' band, apart from tab10's ops


def has_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"the PNG needs matplotlib: pip install '{EXTRA}'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def render(procs: list[Process], path: str, title: str = "dpobs timeline") -> None:
    plt = require_matplotlib()
    from matplotlib.patches import Patch

    origin = origin_ns(procs)
    end = max((s["end_ns"] for p in procs for s in p.spans), default=origin + 1)
    scale, unit = (1e6, "ms") if end - origin < 2e9 else (1e9, "s")
    span = (end - origin) / scale
    least = span / 1500  # an op shorter than a pixel or so is still drawn
    ops = sorted({s["attributes"]["op"] for p in procs for s in p.spans if s["kind"] == "op"})
    colors = {op: plt.cm.tab10(i % 10) for i, op in enumerate(ops)}
    fig, ax = plt.subplots(figsize=(14, 1.6 + 0.42 * max(len(procs), 1)), dpi=110)
    for lane, proc in enumerate(procs):
        _lane(ax, lane, proc, origin, scale, least, colors)
    ax.set_ylim(len(procs), 0)
    ax.set_xlim(0, span)
    ax.set_yticks([i + 0.5 for i in range(len(procs))])
    ax.set_yticklabels([_label(p) for p in procs], fontsize=9 if len(procs) <= 16 else 7)
    ax.set_xlabel(f"time ({unit}) since the first span; each process on its own wall clock")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=op) for op, c in colors.items()]
    handles += [Patch(facecolor="#c7c7c7", edgecolor="#555555", label="step (| boundary)"),
                Patch(facecolor="white", edgecolor=WAIT_COLOR, hatch="////",
                      label="exposed wait")]
    if any(s["kind"] == "weights" for p in procs for s in p.spans):
        handles.append(Patch(facecolor=WEIGHTS_COLOR, edgecolor="white", hatch="xx",
                             label="weight sync"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles),
              fontsize=9, frameon=False)
    ax.set_title(title, loc="right", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _label(proc: Process) -> str:
    r = proc.resource
    return f"{r.get('role', '?')} {r.get('rank', '?')} ({r.get('node', '?')})"


def _lane(ax, lane: int, proc: Process, origin: int, scale: float, least: float,
          colors: dict) -> None:
    label_w = least * 40
    def bars(spans):
        return [((s["start_ns"] - origin) / scale,
                 max((s["end_ns"] - s["start_ns"]) / scale, least)) for s in spans]

    def y(pos):
        return lane + pos[0], pos[1]

    if lane % 2:
        ax.axhspan(lane, lane + 1, color="#f4f4f4", zorder=0)
    steps = sorted((s for s in proc.spans if s["kind"] == "step"),
                   key=lambda s: s["start_ns"])
    shades = ["#c7c7c7", "#9e9e9e"]
    for i, ((x, w), s) in enumerate(zip(bars(steps), steps)):
        ax.broken_barh([(x, w)], y(STEP_Y), facecolors=shades[i % 2], zorder=2)
        ax.vlines(x, lane + 0.04, lane + 0.96, colors="#555555", linewidth=0.8, zorder=3)
        if w > label_w:  # the step's number, where it fits
            ax.text(x + w / 2, lane + STEP_Y[0] + STEP_Y[1] / 2, str(s["attributes"]["step"]),
                    ha="center", va="center", fontsize=6.5, color="#222222", zorder=5)
    for op, color in colors.items():
        mine = [s for s in proc.spans if s["kind"] == "op" and s["attributes"]["op"] == op]
        if mine:
            ax.broken_barh(bars(mine), y(OP_Y), facecolors=color, edgecolors="white",
                           linewidth=0.3, zorder=4)
    syncs = [s for s in proc.spans if s["kind"] == "weights"]
    if syncs:
        ax.broken_barh(bars(syncs), y(OP_Y), facecolors=WEIGHTS_COLOR, edgecolors="white",
                       hatch="xx", linewidth=0.3, zorder=4)
    waits = [s for s in proc.spans if s["kind"] == "wait"]
    if waits:
        ax.broken_barh(bars(waits), y(WAIT_Y), facecolors="white", edgecolors=WAIT_COLOR,
                       hatch="////", linewidth=0.8, zorder=4)
