"""TransferQueue (0.1.11) on dpobs: its key-value API and its client classes measured as the
ops of the contract.

    import dpobs_otel as dpobs
    from dpobs_otel.adapters import transferqueue
    tel = dpobs.start(role="trainer", rank=0)
    tq = transferqueue.instrument(tel)   # was: import transfer_queue as tq
    tq.init(conf); tq.kv_batch_put(...); tq.kv_batch_get(...); tq.close()

or with no code change: TransferQueueInstrumentor (entry point `transfer_queue`,
`opentelemetry-instrument`, DPOBS_AUTO=1).

    kv.py            instrument(), InstrumentedTransferQueue, TransferQueueDataPlane: kv_*
    client.py        TransferQueueClient / AsyncTransferQueueClient methods, measured
    digests.py       the wire guard's digests carried in the rows' tags
    instrumentor.py  TransferQueueInstrumentor
    package.py       the version it instruments

Only the instrumentor is imported with the package (the OpenTelemetry launcher loads every
entry point at start-up); the rest, and torch with it, on first use of a name.
"""
from __future__ import annotations

from ..instrumentation import lazy_names
from .instrumentor import KV_FUNCTIONS, TransferQueueInstrumentor

__all__ = ["instrument", "InstrumentedTransferQueue", "TransferQueueDataPlane",
           "TransferQueueInstrumentor", "KV_FUNCTIONS"]

__getattr__ = lazy_names(__name__, {"instrument": "kv", "InstrumentedTransferQueue": "kv",
                                    "TransferQueueDataPlane": "kv"})
