"""A Mooncake master on loopback, for tests, benchmarks and demos.

    with MooncakeMaster(lease_ms=500) as master:
        store = master.connect()          # a set-up MooncakeDistributedStore
        ...

Starts the `mooncake_master` binary of the installed wheel with its RPC and metrics servers
bound to 127.0.0.1 and its own metadata server off, and the wheel's Python HTTP metadata
server bound to 127.0.0.1 (the master's built-in one was seen on 0.0.0.0 whatever its host
flag). Ports are free ones picked at start. Both processes are stopped by pid, never by
name: nothing here looks for or signals processes it did not start.

Clients advertise the address in MC_TCP_BIND_ADDRESS; `connect` sets it to 127.0.0.1 when
unset, since otherwise the TCP transport advertises (and peers connect to) another interface.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .processes import free_port

HOST = "127.0.0.1"


def master_binary() -> str:
    """The wheel's mooncake_master (the package directory), else one on PATH."""
    import mooncake

    for base in mooncake.__path__:
        candidate = Path(base) / "mooncake_master"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return str(candidate)
    found = shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError("mooncake_master not found: pip install 'dpobs-otel[mooncake]'")
    return found


def _wait_listening(port: int, proc: subprocess.Popen, what: str, log: Path,
                    timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n"
                               f"{log.read_text(errors='replace')[-2000:]}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on {HOST}:{port} in {timeout} s; log {log}")


SETUP_TRIES = 3


def connect_store(rpc_address: str, metadata_url: str, global_segment: int = 64 << 20,
                  local_buffer: int = 64 << 20):
    """A MooncakeDistributedStore set up (TCP, loopback) against the master at rpc_address.
    The store's global segment holds part of everyone's data: keep it open while others
    read what it holds."""
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", HOST)
    from mooncake.store import MooncakeDistributedStore

    # The store's name carries a port from free_port() (a parallel test worker's own range)
    # instead of one Mooncake picks. A setup that fails is tried again on another port, each
    # failure printed: a parallel run once failed on -1 here, its cause not recorded.
    for _ in range(SETUP_TRIES):
        store = MooncakeDistributedStore()
        local = f"{HOST}:{free_port()}"
        rc = store.setup(local, metadata_url, global_segment, local_buffer, "tcp", "",
                         rpc_address)
        if rc == 0:
            return store
        print(f"dpobs testing: MooncakeDistributedStore.setup as {local} returned {rc}; "
              "trying another port", file=sys.stderr)
    raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc} ({SETUP_TRIES} tries, "
                       f"the last as {local})")


class MooncakeMaster:
    """One master plus metadata server on free loopback ports. `lease_ms` is the master's
    -default_kv_lease_ttl (a read's lease on a key; Mooncake's default is 10 s)."""

    def __init__(self, lease_ms: int = 500, *, start_timeout: float = 30.0,
                 extra_flags: tuple[str, ...] = ()):
        self.lease_ms = int(lease_ms)
        self.rpc_port = free_port(HOST)
        self.metadata_port = free_port(HOST)
        self.metrics_port = free_port(HOST)
        self._timeout = start_timeout
        self._flags = tuple(extra_flags)
        self._dir = Path(tempfile.mkdtemp(prefix="dpobs-mooncake-"))
        self._procs: list[subprocess.Popen] = []

    @property
    def rpc_address(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{HOST}:{self.metadata_port}/metadata"

    @property
    def admin_url(self) -> str:
        """The master's HTTP admin/metrics server (/metrics, /get_all_keys, ...)."""
        return f"http://{HOST}:{self.metrics_port}"

    @property
    def pids(self) -> list[int]:
        """The processes start() started (metadata server, master) that are still running."""
        return [p.pid for p in self._procs if p.poll() is None]

    @property
    def lease_s(self) -> float:
        return self.lease_ms / 1000.0

    def start(self) -> "MooncakeMaster":
        meta_log = self._dir / "metadata.log"
        self._spawn([sys.executable, "-m", "mooncake.http_metadata_server", "--host", HOST,
                     "--port", str(self.metadata_port), "--log-level", "WARNING"], meta_log)
        master_log = self._dir / "master.log"
        self._spawn([master_binary(), f"-rpc_port={self.rpc_port}", f"-rpc_address={HOST}",
                     f"-metrics_port={self.metrics_port}", f"-metrics_host={HOST}",
                     "-enable_http_metadata_server=false",
                     f"-default_kv_lease_ttl={self.lease_ms}", "-logtostderr", *self._flags],
                    master_log)
        try:
            _wait_listening(self.metadata_port, self._procs[0], "metadata server", meta_log,
                            self._timeout)
            _wait_listening(self.rpc_port, self._procs[1], "mooncake_master", master_log,
                            self._timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, argv: list[str], log: Path) -> None:
        with open(log, "wb") as out:
            self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL))

    def connect(self, global_segment: int = 64 << 20, local_buffer: int = 64 << 20):
        """A MooncakeDistributedStore set up against this master, its segment mounted."""
        return connect_store(self.rpc_address, self.metadata_url, global_segment, local_buffer)

    def stop(self) -> None:
        """Stop what start() started, by pid: SIGTERM, then SIGKILL after 5 s."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
