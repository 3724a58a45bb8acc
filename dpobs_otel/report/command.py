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
    p.add_argument("--png", required=True, metavar="FILE", help="where to write the page")


def build(prometheus: str | None, sd_dir: str | None, job: str) -> Page:
    """The page from Prometheus (the last 5m) or, without one, the cluster view (every
    process since its start); the caption says which."""
    from ..readback import headline
    title = f"dpobs: the overview's answers, job {job}"
    if prometheus:
        from ..readback.prometheus import Prometheus
        from .queries import from_prometheus
        prom = Prometheus(prometheus, timeout=10)
        found = from_prometheus(prom, job)
        said = headline.from_rules(prom, job)
        return page(title, f"Source: Prometheus {prometheus}, the overview dashboard's "
                    "queries over the last 5m", found, headline.sentence(said))
    from ..readback.cluster import ClusterView
    view = ClusterView(sd_dir, job, timeout=5)
    view.step_metrics()
    said = headline.from_deltas(view.last.deltas.values())
    return page(title, f"Source: the cluster view of {sd_dir} (no Prometheus), each process "
                "since its start", from_window(view.last, view.breakdown()),
                headline.sentence(said))


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
    if args.sd_dir and not Path(args.sd_dir).is_dir():
        raise SystemExit(f"dpobs report: --sd-dir {args.sd_dir}: no such directory (the "
                         "DPOBS_SD_DIR the job's processes register in)")
    try:
        shown = build(args.prometheus, args.sd_dir, args.job)
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
