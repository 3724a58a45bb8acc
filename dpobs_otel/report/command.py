"""`dpobs report --prometheus URL | --sd-dir DIR --png FILE`, and the demo's picture."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import Settings
from .answers import Page, from_window, page

DEMO_PNG = "dpobs-answers.png"


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--prometheus", metavar="URL",
                       help="a Prometheus with dpobs's recording rules: the overview's queries")
    where.add_argument("--sd-dir", metavar="DIR",
                       help="no Prometheus: the cluster view of this file_sd directory")
    p.add_argument("--job", default="dpobs", help="the job to draw (default: %(default)s)")
    p.add_argument("--at", metavar="TIME", type=when,
                   help="with --prometheus: the 5m window ending at TIME (epoch seconds or "
                   "RFC 3339, e.g. 2026-12-07T11:00:00Z); without it, now, or for a job that "
                   "has ended its last evaluation")
    p.add_argument("--png", required=True, metavar="FILE", help="where to write the page")


def when(text: str) -> float:
    """--at's TIME as epoch seconds: a number, or an RFC 3339 time."""
    from ..readback.prometheus import PrometheusError, timestamp
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = timestamp(text)
    except (PrometheusError, ValueError):
        t = None
    if t is None:
        raise argparse.ArgumentTypeError(f"{text!r}: not epoch seconds nor an RFC 3339 time")
    return t


LOOKBACK_S = 7 * 86400  # how far back an ended job's last evaluation is looked for


class At:
    """A Prometheus whose instant queries all run at one time (None: now), so the overview's
    queries and the verdict's rules read the same window."""

    def __init__(self, prom, t: float | None):
        self.prom, self.t = prom, t

    def query(self, expr: str) -> list[dict]:
        return self.prom.query(expr, at=self.t)


def last_evaluation(prom, job: str, now: float) -> float | None:
    """When the job's recording rules last had a value: now while it runs, else the time of
    their last sample before its targets went away (None: never within LOOKBACK_S). A coarse
    pass finds the step holding the last sample, a fine one its own timestamp."""
    from .. import names
    rule = f'{names.JOB_FRAC_OF_STEP}{{job="{job}"}}'
    if prom.query(rule, at=now):
        return None
    coarse = LOOKBACK_S / 5000  # under Prometheus's 11,000 points per series
    found = prom.query_range(f"last_over_time({rule}[{coarse:.0f}s])", now - LOOKBACK_S, now,
                             coarse)
    ends = [float(ts) for r in found for ts, _ in r["values"]]
    if not ends:
        return None
    end = max(ends)
    fine = prom.query_range(f"timestamp({rule})", end - coarse - 1, end, 1)
    stamps = [float(v) for r in fine for _, v in r["values"]]
    return max(stamps) if stamps else end


def build(prometheus: str | None, sd_dir: str | None, job: str,
          at: float | None = None) -> Page:
    """The page from Prometheus (the 5m ending now, at `at`, or, for a job that has ended, at
    its last evaluation) or, without one, the cluster view (every process since its start);
    the caption says which."""
    from ..readback import headline
    title = f"dpobs: the overview's answers, job {job}"
    if prometheus:
        from ..readback.prometheus import Prometheus
        from .queries import from_prometheus
        prom, window = _window(Prometheus(prometheus, timeout=10), job, at)
        found = from_prometheus(prom, job)
        said = headline.from_rules(prom, job)
        return page(title, f"Source: Prometheus {prometheus}, the overview dashboard's "
                    f"queries over the {window}", found, headline.sentence(said))
    from ..readback.cluster import ClusterView
    view = ClusterView(sd_dir, job, timeout=5)
    view.step_metrics()
    said = headline.from_deltas(view.last.deltas.values())
    return page(title, f"Source: the cluster view of {sd_dir} (no Prometheus), each process "
                "since its start", from_window(view.last, view.breakdown()),
                headline.sentence(said))


def _window(prom, job: str, at: float | None) -> tuple[At, str]:
    """The Prometheus to read (at one time) and the caption's words for its window."""
    import time
    if at is None:
        at = last_evaluation(prom, job, time.time())
        if at is None:
            return At(prom, None), "last 5m"
        return At(prom, at), f"5m ending at {_utc(at)}, the job's last evaluation"
    return At(prom, at), f"5m ending at {_utc(at)}"


def _utc(t: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def verdict(prometheus: str | None, sd_dir: str | None, job: str) -> str:
    """The job's one-line verdict alone, as `dpobs report` prints it (the demo's first
    line): the recording rules of a Prometheus, or the cluster view of a file_sd directory
    (each process since its start). Raises PrometheusError as build() does."""
    from ..readback import headline
    if prometheus:
        from ..readback.prometheus import Prometheus
        return headline.sentence(headline.from_rules(Prometheus(prometheus, timeout=10), job))
    from ..readback.cluster import ClusterView
    view = ClusterView(sd_dir, job, timeout=5)
    view.step_metrics()
    return headline.sentence(headline.from_deltas(view.last.deltas.values()))


def run(args: argparse.Namespace) -> int:
    """The page, or one line that says what is missing (exit 1): no traceback for a
    Prometheus that does not answer, a file_sd directory or a PNG folder that is not there."""
    from ..readback.prometheus import PrometheusError
    from .draw import write
    folder = Path(args.png).parent
    if not folder.is_dir():
        raise SystemExit(f"dpobs report: --png {args.png}: no directory {folder}")
    if args.at is not None and not args.prometheus:
        raise SystemExit("dpobs report: --at needs --prometheus URL (the cluster view of "
                         "--sd-dir reads only the processes still running)")
    if args.sd_dir and not Path(args.sd_dir).is_dir():
        raise SystemExit(f"dpobs report: --sd-dir {args.sd_dir}: no such directory (the "
                         "DPOBS_SD_DIR the job's processes register in)")
    try:
        shown = build(args.prometheus, args.sd_dir, args.job, args.at)
        write(shown, args.png)
    except PrometheusError as e:
        raise SystemExit(f"dpobs report: --prometheus {args.prometheus}: {e}") from None
    except OSError as e:  # the PNG could not be written (permissions, a full disk)
        raise SystemExit(f"dpobs report: --png {args.png}: {e.strerror or e}") from None
    print(shown.verdict)
    print(f"{args.png}: {len(shown.panels)} panels; {shown.caption}")
    return 0 if shown.panels else 1


def demo_png(prometheus: str | None, sd_dir: str | None, job: str, folder, out) -> None:
    """The demo's picture, in its run folder (never in the repository: `make demo` leaves
    the tree clean). A picture that cannot be drawn is said, and the demo goes on."""
    if not (prometheus or sd_dir):
        print("No picture: the demo ran without Prometheus and without --sd-dir", file=out)
        return
    path = Path(folder) / DEMO_PNG
    job = job or Settings.job  # the demo's processes take the default job unless told
    try:
        from .draw import write
        write(build(prometheus, sd_dir, job), str(path))
    except (Exception, SystemExit) as exc:  # the report above is the demo's answer
        print(f"No picture: {type(exc).__name__}: {exc}", file=out)
        return
    print(f"The answers as a picture (dpobs report): {path}", file=out)
