"""The data planes the demo (and `dpobs compare`) can run its workload on.

A backend starts its servers in the parent (`start`) and hands the workload processes a
picklable spec; each process turns the spec into a data-plane client (`connect`). The
workload only ever speaks the data-plane protocol, so every backend is measured at the same
interface by the same wrapper.

    memory         the embedded reference store, served to the processes from the parent,
                   with --store-latency-ms of service time added to every call
    mooncake       a Mooncake master and metadata server on loopback (a short read lease, so
                   the driver's clears land within the step), MooncakeDataPlane per process
    transferqueue  a local Ray (127.0.0.1, no dashboard) with TransferQueue's controller and
                   one storage unit, TransferQueueDataPlane per process
    ray            Ray's object store itself: no store to start here; the driver process
                   starts its own local Ray (ray_plane.RayWorkload runs that workload)
"""
from __future__ import annotations

import importlib.util

BACKENDS = ("memory", "transferqueue", "mooncake", "ray")
MOONCAKE_LEASE_MS = 200  # the demo's read lease: short, so a step's clear is not deferred long


def available(name: str) -> str | None:
    """None when the backend can run here, else why not (what to install)."""
    need = {"memory": None, "transferqueue": "transfer_queue", "mooncake": "mooncake.store",
            "ray": "ray"}
    mod = need[name]
    try:
        if mod is None or importlib.util.find_spec(mod.split(".")[0]) is not None:
            return None
    except (ImportError, ValueError):
        pass
    return f"pip install 'dpobs-otel[{name}]'"


class Running:
    """A started backend: `spec` for the processes, `close()` for the parent."""

    def __init__(self, name: str, spec: tuple, close):
        self.name, self.spec, self._close = name, spec, close

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()


def start(name: str, latency_s: float, authkey: bytes, initializer=None,
          store_metrics: bool = False) -> Running:
    """store_metrics: the store's own exporter on (TransferQueue only)."""
    if name == "memory":
        from ..stores.memory import serve_store
        mgr, address = serve_store(latency_s, authkey, initializer=initializer)
        # A lambda, not mgr.shutdown: that Finalize holds the manager weakly, and a manager
        # nobody holds is shut down when collected.
        return Running(name, ("memory", address, authkey), lambda: mgr.shutdown())
    if name == "mooncake":
        from ..testing.mooncake import MooncakeMaster
        master = MooncakeMaster(lease_ms=MOONCAKE_LEASE_MS).start()
        return Running(name, ("mooncake", master.rpc_address, master.metadata_url,
                              master.lease_s), master.stop)
    if name == "transferqueue":
        from ..testing import transferqueue as tq_local
        handle = tq_local.start(metrics=store_metrics)
        return Running(name, ("transferqueue", handle.ray_address), tq_local.stop)
    raise ValueError(f"unknown backend {name!r}; one of {', '.join(BACKENDS)}")


def connect(spec: tuple, tel=None):
    """In a workload process: the data-plane client for a started backend's spec. tel: the
    process's Telemetry, when it is measured (TransferQueue: its init announces the
    controller's exporter for file_sd, as any measured init does)."""
    kind = spec[0]
    if kind == "memory":
        from ..stores.memory import connect_store
        return connect_store(spec[1], spec[2])
    if kind == "mooncake":
        from ..adapters.mooncake import MooncakeDataPlane
        from ..testing.mooncake import connect_store
        return MooncakeDataPlane(connect_store(spec[1], spec[2]), lease_s=spec[3])
    if kind == "transferqueue":
        from ..testing import transferqueue as tq_local
        from ..adapters.transferqueue import TransferQueueDataPlane
        from ..adapters.transferqueue import instrument
        tq_local.attach(spec[1], init=None if tel is None else instrument(tel).init)
        return TransferQueueDataPlane()
    raise ValueError(f"unknown backend spec {kind!r}")


def disconnect(spec: tuple, client) -> None:
    """In a workload process, on the way out: what connect() opened (never the servers)."""
    if spec[0] == "mooncake":
        client.close()  # the deferred-removal thread; the keys stay with the master
    elif spec[0] == "transferqueue":
        from ..testing import transferqueue as tq_local
        tq_local.detach()  # the client only: tq.close() would stop TransferQueue itself
