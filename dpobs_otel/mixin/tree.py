"""`dpobs mixin --out DIR`: every operator artifact, from the package and one Config.

    DIR/prometheus/   prometheus.yml (one machine, file_sd), central.yml (agents remote-write
                      into it), rules/*.rules.yml, tests/*.test.yml (promtool unit tests)
    DIR/alertmanager/ alertmanager.yml
    DIR/grafana/provisioning/
    DIR/kubernetes/   manifests
    DIR/agent/        an example `dpobs agent` config and how to run it
    DIR/dashboards/   Grafana JSON

The repository commits DIR/dashboards as dashboards/ and the rest as deploy/, and a test
regenerates both and fails on any difference.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from .alerts import alerts_file
from .config import DEFAULT, RUNBOOK_PLACEHOLDER, Config
from .configs import alertmanager_yml, central_yml, prometheus_yml
from .grafana import MissingExtra, build_dashboards, grafana_provisioning
from .kubernetes import build_manifests
from .render import write_files
from .rules import recording_file

RECORDING = "dpobs-recording.rules.yml"
ALERTS = "dpobs-alerts.rules.yml"


def promtool_tests(c: Config) -> dict[str, str]:
    """The shipped promtool unit tests (package data), with the Config's runbook base URL.
    They pin the default thresholds: with other thresholds they are left out, since they
    would fail on values they were not written for."""
    if not c.promtool_tests_apply():
        return {}
    base = f"{RUNBOOK_PLACEHOLDER}/docs/runbook.md#"
    mine = f"{c.runbook_base_url.rstrip('/')}/docs/runbook.md#"
    folder = resources.files(__package__) / "promtool"
    return {f.name: f.read_text().replace(base, mine)
            for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".yml")}


def agent_files() -> dict[str, str]:
    """DIR/agent, from the agent's own config renderer (exporters/agent.py)."""
    from .agent_example import agent_files as build
    return build()


def servers(c: Config = DEFAULT) -> dict[str, str]:
    """What a Prometheus and an Alertmanager load: DIR/prometheus and DIR/alertmanager."""
    files = {"prometheus/prometheus.yml": prometheus_yml(c),
             "prometheus/central.yml": central_yml(c),
             f"prometheus/rules/{RECORDING}": recording_file(c),
             f"prometheus/rules/{ALERTS}": alerts_file(c),
             "alertmanager/alertmanager.yml": alertmanager_yml(c)}
    return files | {f"prometheus/tests/{n}": t for n, t in promtool_tests(c).items()}


def _cache_root() -> Path:
    """~/.cache/dpobs-otel (or $XDG_CACHE_HOME's), else the temp dir when home is read-only."""
    for base in (os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                 tempfile.gettempdir()):
        root = Path(base) / "dpobs-otel"
        try:
            root.mkdir(parents=True, exist_ok=True)
            return root
        except OSError:
            continue
    raise OSError("no writable cache directory for the mixin's server configs")


def default_servers() -> Path:
    """DIR/prometheus and DIR/alertmanager for the default Config, as files on disk (a
    Prometheus reads rule files by path), for the demo's private stack. Written once per
    content into the user's cache, named by a hash of the content, so an installed wheel
    needs no checkout and two versions never share a directory."""
    files = servers()
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
    target = _cache_root() / f"mixin-{digest}"
    if not target.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".mixin-", dir=target.parent))
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        try:
            tmp.rename(target)  # atomic: a reader sees all of it or none
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def build(c: Config = DEFAULT) -> dict[str, str]:
    """Relative path -> text for the whole tree; MissingExtra without grafana-foundation-sdk."""
    files = servers(c)
    files |= {f"grafana/provisioning/{n}": t for n, t in grafana_provisioning().items()}
    files |= {f"kubernetes/{n}": t for n, t in build_manifests(c).items()}
    files |= {f"agent/{n}": t for n, t in agent_files().items()}
    files |= {f"dashboards/{n}": t for n, t in build_dashboards(c).items()}
    return files


def write(out: str | Path, c: Config = DEFAULT,
          dashboards_out: str | Path | None = None) -> dict[str, str]:
    """Write the tree under `out`; DIR/dashboards goes to `dashboards_out` when given (the
    repository keeps it at the top: `dpobs mixin --out deploy --dashboards-out dashboards`)."""
    files = build(c)
    boards = {k: v for k, v in files.items() if k.startswith("dashboards/")}
    if dashboards_out is None:
        write_files(Path(out), files)
    else:
        write_files(Path(out), {k: v for k, v in files.items() if k not in boards})
        write_files(Path(dashboards_out), {k.split("/", 1)[1]: v for k, v in boards.items()})
    return files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="directory to write the tree into")
    parser.add_argument("--dashboards-out", type=Path, metavar="DIR",
                        help="write the dashboards here instead of OUT/dashboards")
    parser.add_argument("--cluster-label", default=DEFAULT.cluster_label,
                        help="a label every aggregation keeps, e.g. cluster (default: none)")
    parser.add_argument("--job-selector", default=DEFAULT.job_selector,
                        help="matchers added to every raw selector, e.g. 'job=~\"grpo-.*\"'")
    parser.add_argument("--runbook-base-url", default=DEFAULT.runbook_base_url,
                        help="runbook_url = BASE/docs/runbook.md#<alert> "
                             f"(default: the placeholder {DEFAULT.runbook_base_url})")


def run(args: argparse.Namespace) -> int:
    c = Config(cluster_label=args.cluster_label, job_selector=args.job_selector,
               runbook_base_url=args.runbook_base_url)
    try:
        write(args.out, c, args.dashboards_out)
    except MissingExtra as err:
        print(f"dpobs mixin: {err}", file=sys.stderr)
        return 2
    return 0
