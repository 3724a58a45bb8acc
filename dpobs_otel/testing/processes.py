"""What every loopback launcher here shares: a context-manager base that cleans up after a
start that failed half-way, a kernel-delivered signal when the parent dies, a free port, and
stopping a child politely first."""
from __future__ import annotations

import ctypes
import signal
import socket
import subprocess


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies, so nothing
    outlives a demo or test that was killed outright. A no-op elsewhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
