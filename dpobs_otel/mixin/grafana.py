"""Grafana: the provisioning files, and `dpobs dashboards --out DIR` (the dashboard JSON
alone). The dashboards themselves are built in dashboards.py with grafana-foundation-sdk,
which the `dashboards` extra installs; without it this says which extra to install."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import DEFAULT, Config
from .render import sections, write_files

INSTALL_HINT = ("the Grafana dashboards are built with grafana-foundation-sdk, which is not "
                "installed: pip install 'dpobs-otel[dashboards]'")


class MissingExtra(ImportError):
    """An optional dependency of the mixin is not installed; str() says how to get it."""


def build_dashboards(c: Config = DEFAULT) -> dict[str, str]:
    """File name -> dashboard JSON; MissingExtra without the dashboards extra."""
    try:
        from .dashboards import build_dashboards as build
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("grafana_foundation_sdk"):
            raise
        raise MissingExtra(INSTALL_HINT) from None
    return build(c)


def grafana_provisioning() -> dict[str, str]:
    """Path under grafana/provisioning -> text."""
    dashboards = sections((
        "Loads the generated dashboards/*.json (mounted read-only at /etc/dpobs/dashboards).\n"
        "Edits belong in dpobs_otel/mixin/dashboards.py, so the UI may not save over them.",
        {"apiVersion": 1, "providers": [{
            "name": "dpobs", "orgId": 1, "folder": "dpobs", "type": "file",
            "disableDeletion": True, "allowUiUpdates": False, "updateIntervalSeconds": 30,
            "options": {"path": "/etc/dpobs/dashboards"}}]}))
    datasources = sections((
        "The Prometheus of docker-compose.yml. The uid is fixed so links and provisioned\n"
        "alerting can name it; the dashboards themselves go through their ${datasource}\n"
        "variable. timeInterval equals Prometheus's scrape_interval, so $__rate_interval\n"
        "always spans 4 scrapes.",
        {"apiVersion": 1, "datasources": [{
            "name": "Prometheus", "uid": "dpobs-prometheus", "type": "prometheus",
            "access": "proxy", "url": "http://prometheus:9090", "isDefault": True,
            "editable": False, "jsonData": {"timeInterval": "15s"}}]}))
    return {"dashboards/dpobs.yaml": dashboards, "datasources/prometheus.yaml": datasources}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("dashboards"),
                        help="directory for <uid>.json (default: dashboards)")


def run(args: argparse.Namespace) -> int:
    try:
        files = build_dashboards()
    except MissingExtra as err:
        print(f"dpobs dashboards: {err}", file=sys.stderr)
        return 2
    write_files(args.out, files)
    return 0
