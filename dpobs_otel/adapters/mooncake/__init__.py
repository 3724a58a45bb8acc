"""Mooncake (mooncake-transfer-engine 0.3.13) as a dpobs data plane.

    from mooncake.store import MooncakeDistributedStore
    from dpobs_otel.adapters.mooncake import MooncakeDataPlane, instrument_store
    store = MooncakeDistributedStore(); store.setup(...)      # docs/guides/mooncake.md
    client = tel.instrument(MooncakeDataPlane(store))         # the protocol, measured
    raw = instrument_store(tel, store)                        # or Mooncake's own API, measured
    MooncakeInstrumentor().instrument()                       # or every store, no code change

    plane.py         MooncakeDataPlane: the data-plane protocol on Mooncake's keys
    index.py         which ids a partition holds (per-writer slots; Mooncake lists no keys)
    leases.py        removals deferred past a read's lease
    store.py         instrument_store: Mooncake's own API measured; its error codes
    instrumentor.py  MooncakeInstrumentor (entry point `mooncake`, DPOBS_AUTO=1)
    package.py       the wheels it instruments

Only the instrumentor is imported with the package (the OpenTelemetry launcher loads every
entry point at start-up); the rest, and torch with it, on first use of a name.
"""
from __future__ import annotations

from ..instrumentation import lazy_names
from .instrumentor import MooncakeInstrumentor

__all__ = ["MooncakeDataPlane", "MooncakeError", "InstrumentedMooncakeStore",
           "instrument_store", "MooncakeInstrumentor"]

__getattr__ = lazy_names(__name__, {"MooncakeDataPlane": "plane", "MooncakeError": "store",
                                    "InstrumentedMooncakeStore": "store",
                                    "instrument_store": "store"})
