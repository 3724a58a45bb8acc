"""`dpobs timeline --sd-dir DIR [--steps N] --out TRACE.json [--png TIMELINE.png]`: every
traced process listed in DIR, its /trace fetched in parallel (https when the DPOBS_TLS_*
variables are set, as for cluster_step_metrics), merged on the wall clock into a Chrome
trace-event JSON (ui.perfetto.dev, chrome://tracing) and, with --png, a swimlane picture."""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import collect, events

PNG_STEPS = 12  # what a picture shows when --steps is not given: more is unreadable


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sd-dir", default=None, metavar="DIR",
                   help="the file_sd directory the processes announce themselves in "
                        "(default DPOBS_SD_DIR)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="only each process's last N traced steps (default: its whole ring)")
    p.add_argument("--out", required=True, metavar="TRACE.json",
                   help="the Chrome trace-event JSON to write")
    p.add_argument("--png", default=None, metavar="TIMELINE.png",
                   help="also draw the swimlane picture of the last N steps (default "
                        f"{PNG_STEPS}; needs the extra dpobs-otel[timeline])")
    p.add_argument("--job", default=None, help="only this job's processes (default: all)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="per process (default 5)")


def ssl_context():
    from ..config import Settings
    from ..readback.cluster import tls_context_for
    return tls_context_for(Settings.resolve())


def write(addresses: list[str], out: str, png: str | None = None, steps: int | None = None,
          timeout: float = 5.0, ssl=None, png_steps: int | None = None, err=None):
    """Collect, write the JSON (and the PNG of the last png_steps steps, default `steps`);
    returns (processes, {address: reason})."""
    if png:
        from .picture import require_matplotlib
        require_matplotlib()  # before the collection: say which extra is missing up front
    got, missing = collect.collect(addresses, steps, timeout, ssl)
    for address, why in sorted(missing.items()):
        print(f"dpobs timeline: {address}: no trace ({why})", file=err or sys.stderr)
    procs = events.processes(got)
    with open(out, "w") as f:
        json.dump(events.chrome_trace(procs, missing), f)
    if png:
        from .picture import render
        shown = events.last(procs, png_steps) if png_steps else procs
        n = png_steps or steps
        render(shown, png, f"dpobs timeline: the last {n} steps" if n else "dpobs timeline")
    return procs, missing


def add_trace_flag(p: argparse.ArgumentParser) -> None:
    """`dpobs demo --trace`."""
    p.add_argument("--trace", action="store_true",
                   help="trace every process (dpobs.start(trace=True)) and write trace.json "
                        "(Perfetto) and timeline.png of the measured steps into the log folder")


def demo_outputs(cfg, info: dict, folder, out=None, png_steps: int = PNG_STEPS) -> None:
    """`dpobs demo --trace` (nothing without it): trace.json of the measured steps and
    timeline.png of the last few, in `folder`, from the processes in `info` ((role, rank) ->
    {"endpoint": ...}); without matplotlib the JSON alone, and which extra draws the picture."""
    if not cfg.trace:
        return
    from .picture import EXTRA, has_matplotlib

    out = out or sys.stdout
    steps = cfg.steps if cfg.duration is None else None  # the warm-up step left out
    trace, png = os.path.join(folder, "trace.json"), os.path.join(folder, "timeline.png")
    drawn = has_matplotlib()
    procs, _ = write([i["endpoint"] for i in info.values()], trace, png if drawn else None,
                     steps, png_steps=min(png_steps, steps or png_steps), err=out)
    print(f"\nTimeline ({len(procs)} processes): {trace}  (open it in ui.perfetto.dev)", file=out)
    print(f"  picture of the last steps: {png}" if drawn else
          f"  no picture: it needs matplotlib, pip install '{EXTRA}'", file=out)


def run(args) -> int:
    from ..readback.scrape import targets

    sd_dir = args.sd_dir or os.environ.get("DPOBS_SD_DIR")
    if not sd_dir or not os.path.isdir(sd_dir):
        raise SystemExit(f"dpobs timeline: --sd-dir {sd_dir}: not a directory")
    if args.steps is not None and args.steps < 1:
        raise SystemExit("dpobs timeline: --steps must be >= 1")
    addresses = sorted({t.address for t in targets(sd_dir, args.job)})
    if not addresses:
        raise SystemExit(f"dpobs timeline: no process is listed in {sd_dir}")
    procs, missing = write(addresses, args.out, args.png, args.steps, args.timeout,
                           ssl_context(), png_steps=args.steps or PNG_STEPS)
    spans = sum(len(p.spans) for p in procs)
    print(f"{len(procs)} of {len(addresses)} processes, {spans} spans -> {args.out} "
          f"(open it in ui.perfetto.dev or chrome://tracing)"
          + (f"; picture -> {args.png}" if args.png else ""))
    return 0 if procs else 1
