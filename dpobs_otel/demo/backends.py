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
import shutil
import subprocess

BACKENDS = ("memory", "transferqueue", "mooncake", "ray")
MOONCAKE_LEASE_MS = 200  # the demo's read lease: short, so a step's clear is not deferred long
# The Debian packages of the system libraries a backend's binaries load but its wheel does
# not carry (a fresh machine without RDMA has no libibverbs: mooncake_master exits with 127).
LIBRARY_PACKAGES = {"libibverbs.so.1": "libibverbs1", "librdmacm.so.1": "librdmacm1",
                    "libnuma.so.1": "libnuma1"}
_LOADER_SAYS = "error while loading shared libraries: "


class BackendUnavailable(RuntimeError):
    """A backend that cannot start here; its message is one line naming the missing piece."""


def available(name: str) -> str | None:
    """None when the backend can run here, else why not in one line (what to install)."""
    need = {"memory": None, "transferqueue": "transfer_queue", "mooncake": "mooncake.store",
            "ray": "ray"}
    mod = need[name]
    try:
        if mod is None or importlib.util.find_spec(mod.split(".")[0]) is not None:
            return _mooncake_loads() if name == "mooncake" else None
    except (ImportError, ValueError):
        pass
    return f"pip install 'dpobs-otel[{name}]'"


def _mooncake_loads() -> str | None:
    """Why the wheel's mooncake_master cannot run here (a shared library its loader cannot
    find), or None."""
    from ..testing.mooncake import master_binary
    try:
        binary = master_binary()
    except (FileNotFoundError, ImportError) as exc:
        return str(exc)
    missing = missing_libraries(binary)
    return cannot_load("mooncake_master", missing[0]) if missing else None


def missing_libraries(binary: str) -> list[str]:
    """The shared libraries `binary` needs that this machine's loader cannot find, as ldd
    says; [] where there is no ldd (the start itself then tells: start())."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run([ldd, binary], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split("=>")[0].strip() for line in out.splitlines() if "=> not found" in line]


def cannot_load(what: str, library: str) -> str:
    package = LIBRARY_PACKAGES.get(library)
    fix = f"apt install {package}" if package else "install the system package that has it"
    return f"{what} cannot load {library} ({fix})"


def start_failure(exc: BaseException) -> str:
    """A server's failed start in one line: the library its loader missed, where its log
    says so, else the failure's first line (which names the server's log)."""
    text = str(exc)
    first = (text.splitlines() or [type(exc).__name__])[0].rstrip(":")
    if _LOADER_SAYS in text:
        library = text.split(_LOADER_SAYS, 1)[1].split(":", 1)[0].strip()
        return cannot_load(first.split(" exited")[0], library)
    return first


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
    if name not in ("mooncake", "transferqueue"):
        raise ValueError(f"unknown backend {name!r}; one of {', '.join(BACKENDS)}")
    try:
        return _start_server(name, store_metrics)
    except (RuntimeError, OSError) as exc:  # TimeoutError is an OSError
        raise BackendUnavailable(start_failure(exc)) from exc


def _start_server(name: str, store_metrics: bool) -> Running:
    if name == "mooncake":
        from ..testing.mooncake import MooncakeMaster
        master = MooncakeMaster(lease_ms=MOONCAKE_LEASE_MS).start()
        return Running(name, ("mooncake", master.rpc_address, master.metadata_url,
                              master.lease_s), master.stop)
    from ..testing import transferqueue as tq_local
    handle = tq_local.start(metrics=store_metrics)
    return Running(name, ("transferqueue", handle.ray_address), tq_local.stop)


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
