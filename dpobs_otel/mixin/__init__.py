"""The operator artifacts as package data, built from one Config of knobs: recording rules,
alerts, Alertmanager routing, Prometheus configs, promtool tests, Grafana dashboards and
provisioning, Kubernetes manifests and the agent's example config. `dpobs mixin --out DIR`
writes them all (tree.py); `dpobs dashboards` and `dpobs kubernetes` write one part each."""
from __future__ import annotations

from .config import DEFAULT, Config

__all__ = ["Config", "DEFAULT", "build", "write"]


def build(config: Config = DEFAULT) -> dict[str, str]:
    """Relative path -> text of the whole tree `dpobs mixin` writes."""
    from .tree import build as _build
    return _build(config)


def write(out, config: Config = DEFAULT) -> dict[str, str]:
    """Write the tree under `out` (a path); returns what was written."""
    from .tree import write as _write
    return _write(out, config)
