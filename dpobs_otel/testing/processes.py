"""What every loopback launcher here shares: a context-manager base that cleans up after a
start that failed half-way, a kernel-delivered signal when the parent dies, a free port, and
stopping a child politely first."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading

# "LOW-HIGH", inclusive: the ports this process's tests may use (tests/conftest.py gives each
# pytest-xdist worker a slice of its own). The top RAY_WORKER_PORTS of it go to the workers of
# a `ray start --head` cluster, the rest to free_port().
PORTS_ENV = "DPOBS_TEST_PORTS"
RAY_WORKER_PORTS = 200


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies, so nothing
    outlives a demo or test that was killed outright. A no-op elsewhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def port_ranges(environ=os.environ) -> tuple[range, range] | None:
    """(free_port()'s ports, Ray workers' ports) of DPOBS_TEST_PORTS; None when it is unset."""
    value = environ.get(PORTS_ENV, "").strip()
    if not value:
        return None
    try:
        low, high = (int(part) for part in value.split("-"))
    except ValueError:
        low = high = 0
    if not 1 <= low <= high - RAY_WORKER_PORTS <= 65535 - RAY_WORKER_PORTS:
        raise ValueError(f"{PORTS_ENV}={value!r}: want LOW-HIGH, a range of more than "
                         f"{RAY_WORKER_PORTS} ports within 1-65535 (its top {RAY_WORKER_PORTS} "
                         "are for Ray's workers), e.g. 20000-21499")
    ray = high - RAY_WORKER_PORTS + 1
    return range(low, ray), range(ray, high + 1)


class _Turn:
    """Where free_port() goes on in its range: one count for all threads, from a start that the
    pid spreads over the range (a golden-ratio step), so that processes given the same range
    start apart; a forked child starts anew from its own pid."""

    def __init__(self, pid: int | None = None):
        self.lock, self.count = threading.Lock(), 0
        self.start = ((os.getpid() if pid is None else pid) * 0.6180339887498949) % 1

    def next(self, size: int) -> int:
        """The next index into a range of `size` ports; the caller holds the lock."""
        index = (int(self.start * size) + self.count) % size
        self.count += 1
        return index


_TURN = _Turn()
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_TURN.__init__)


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host` now. Under DPOBS_TEST_PORTS, the next bindable one
    of its range: ports below the kernel's ephemeral range are never taken by another process's
    bind to port 0 or outgoing connection, and each xdist worker has a range of its own. Unset:
    the one the kernel picks for a bind to port 0."""
    ranges = port_ranges()
    if ranges is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    ports = ranges[0]
    with _TURN.lock:
        for _ in ports:
            port = ports[_TURN.next(len(ports))]
            if _bindable(host, port):
                return port
    raise RuntimeError(f"{PORTS_ENV}: no port of {ports.start}-{ports[-1]} is free on {host}")


class Managed:
    """`with X() as x:` runs x.start(); x.close() runs on exit, and also when start() fails
    half-way, so nothing it had already started is left behind."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()


def stop(proc: subprocess.Popen | None, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; nothing when it has already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
