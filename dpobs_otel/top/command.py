"""`dpobs top [--prometheus URL | --sd-dir DIR]`: a live terminal view of the answers, for
people without Grafana. With --prometheus it reads the mixin's recording rules and the
firing alerts; with --sd-dir it scrapes every endpoint listed there itself and computes the
same answers over its own window. A failing source or endpoint is shown, never fatal, in the
live view; with --once a failing source is one line and exit 1."""
from __future__ import annotations

import argparse
import os
import time

from .model import Answers


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL",
                     help="a Prometheus that loads the dpobs recording rules")
    src.add_argument("--sd-dir", metavar="DIR",
                     help="a file_sd directory (DPOBS_SD_DIR): scrape its endpoints directly")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="refresh every this many seconds (default 2)")
    p.add_argument("--window", type=float, default=300.0, metavar="SECONDS",
                   help="--sd-dir: the span rates are computed over (default 300, the "
                        "rules' 5m)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per request (default: the refresh interval, at most 5)")
    p.add_argument("--once", action="store_true",
                   help="print one frame and exit (--sd-dir: two scrapes --interval apart)")


def make_source(args):
    timeout = args.timeout or min(max(args.interval, 0.5), 5.0)
    if args.prometheus:
        from .prometheus import RulesSource
        return RulesSource(args.prometheus, timeout=timeout)
    sd_dir = args.sd_dir or os.environ.get("DPOBS_SD_DIR")
    if not sd_dir:
        raise SystemExit("dpobs top: give --prometheus URL or --sd-dir DIR")
    if not os.path.isdir(sd_dir):
        raise SystemExit(f"dpobs top: --sd-dir {sd_dir}: not a directory")
    from .direct import DirectSource
    return DirectSource(sd_dir, window_s=args.window, timeout=timeout)


def safe_answers(source) -> Answers:
    """The source's answers; a bug or an unexpected reply becomes an error line in the
    frame, not a traceback that ends the view."""
    try:
        return source.answers()
    except Exception as e:  # noqa: BLE001 - the view must outlive any one refresh
        return Answers(source.describe(), None, time.time(), error=f"{type(e).__name__}: {e}")


def run(args) -> int:
    if args.interval <= 0 or args.window <= 0:
        raise SystemExit("dpobs top: --interval and --window must be positive")
    try:
        from rich.console import Console

        from .view import frame
    except ImportError:
        raise SystemExit("dpobs top needs rich: pip install 'dpobs-otel[top]'") from None
    source = make_source(args)
    console = Console()
    if args.once:
        if getattr(source, "needs_two_scrapes", False):
            safe_answers(source)
            time.sleep(args.interval)
        a = safe_answers(source)
        if a.error:  # one line, no empty frame around it: the frame would answer nothing
            raise SystemExit(f"dpobs top: {a.source}: {a.error}")
        console.print(frame(a))
        return 0
    return live(source, console, args.interval, frame)


def live(source, console, every: float, frame) -> int:
    from rich.live import Live
    try:
        with Live(console=console, screen=True, auto_refresh=False,
                  redirect_stderr=False) as view:
            while True:
                t0 = time.monotonic()
                view.update(frame(safe_answers(source), every), refresh=True)
                time.sleep(max(0.0, every - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        return 0
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
