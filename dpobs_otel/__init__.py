"""dpobs-otel: data-plane observability for distributed RL training.

    import dpobs_otel as dpobs
    tel = dpobs.start(role="trainer", rank=0)
    client = tel.instrument(my_store_client)
"""
import importlib
from typing import TYPE_CHECKING

from .version import __version__

# Resolved on first use, so `dpobs dashboards` or `dpobs kubernetes` never import torch.
_LAZY = {
    "start": "telemetry", "Telemetry": "telemetry", "Settings": "config",
    "PortInUseError": "exporters.prometheus", "InMemoryDataPlane": "stores.memory",
    "serve_store": "stores.memory",
    "connect_store": "stores.memory",
}
__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load lazily
    from .config import Settings
    from .exporters.prometheus import PortInUseError
    from .stores.memory import InMemoryDataPlane, connect_store, serve_store
    from .telemetry import Telemetry, start


def __dir__():
    return sorted({*globals(), *__all__})


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpobs_otel' has no attribute {name!r}")
