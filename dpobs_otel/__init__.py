"""dpobs-otel: data-plane observability for distributed RL training.

    import dpobs_otel as dpobs
    tel = dpobs.start(role="trainer", rank=0)
    client = tel.instrument(my_store_client)
"""
from .config import Settings
from .endpoint import PortInUseError
from .store import InMemoryDataPlane, connect_store, serve_store
from .telemetry import Telemetry, __version__, start

__all__ = ["start", "Telemetry", "Settings", "InMemoryDataPlane", "serve_store",
           "connect_store", "PortInUseError", "__version__"]
