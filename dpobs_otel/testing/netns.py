"""Simulated nodes for the multi-node test and the scale benchmark: network namespaces.

A `Netns` is a network namespace held open by a `sleep` made with `unshare --net`; a process
is started in it by setns(2) between fork and exec. `link()` joins two namespaces with a
veth pair addressed from 10.231.0.0/16, a private range these helpers configure themselves
on interfaces that exist only inside namespaces they created: nothing here can route off the
machine. `Client` makes requests from inside a given namespace (a worker thread that entered
it), so the calling process itself never joins a node's network.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from .processes import Managed, die_with_parent

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace `fd` refers to."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def can_make_namespaces() -> str | None:
    """None when this process may create network namespaces and veth pairs; else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth pairs)"
    missing = [b for b in ("unshare", "ip", "prometheus") if shutil.which(b) is None]
    if missing:
        return "not on PATH: " + ", ".join(missing)
    return None


class Netns(Managed):
    """`with Netns() as ns:` a fresh network namespace with loopback up."""

    def __init__(self):
        self.holder: subprocess.Popen | None = None
        self.fd: int | None = None

    def start(self) -> None:
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "86400"],
                                       preexec_fn=die_with_parent)
        mine = os.stat("/proc/self/ns/net").st_ino
        path = f"/proc/{self.holder.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.stat(path).st_ino == mine:  # until unshare has made the new namespace
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("unshare --net did not make a namespace")
            time.sleep(0.01)
        self.fd = os.open(path, os.O_RDONLY)
        self.run("ip", "link", "set", "lo", "up")

    @property
    def pid(self) -> int:
        return self.holder.pid

    def _enter(self) -> None:
        setns(self.fd)
        die_with_parent()

    def popen(self, argv, **kw) -> subprocess.Popen:
        return subprocess.Popen(argv, preexec_fn=self._enter, **kw)

    def run(self, *argv: str) -> None:
        subprocess.run(argv, preexec_fn=self._enter, check=True, capture_output=True)

    def close(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def link(hub: Netns, node: Netns, index: int) -> tuple[str, str]:
    """A veth pair hub <-> node on 10.231.<index>.0/30; returns (hub address, node address)."""
    hub_if, node_if = f"dph{index}", f"dpn{index}"
    hub_ip, node_ip = f"10.231.{index}.1", f"10.231.{index}.2"
    hub.run("ip", "link", "add", hub_if, "type", "veth", "peer", "name", node_if,
            "netns", str(node.pid))
    hub.run("ip", "addr", "add", f"{hub_ip}/30", "dev", hub_if)
    hub.run("ip", "link", "set", hub_if, "up")
    node.run("ip", "addr", "add", f"{node_ip}/30", "dev", node_if)
    node.run("ip", "link", "set", node_if, "up")
    return hub_ip, node_ip


class Client:
    """Requests made from inside `ns` (None: this process's own namespace). `pool` is the
    executor a readback.prometheus.Prometheus client takes, to query from there too."""

    def __init__(self, ns: Netns | None = None):
        init = (lambda: setns(ns.fd)) if ns is not None else None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="netns-client", initializer=init)

    def text(self, url: str, timeout: float = 2) -> str | None:
        """The body of a 200 answer, or None (refused, timed out, or another status)."""
        return self.pool.submit(_get_text, url, timeout).result()

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def _get_text(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:  # urllib's HTTPError and URLError are OSErrors
        return None
