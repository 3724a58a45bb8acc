"""Simulated nodes for the multi-node test and the scale benchmark, from real binaries.

A `Netns` is a network namespace held open by a `sleep` made with `unshare --net`; a process
is started in it by setns(2) between fork and exec. `link()` joins two namespaces with a
veth pair addressed from 10.231.0.0/16, a private range these helpers configure themselves
on interfaces that exist only inside namespaces they created: nothing here can route off the
machine. `Central` is a Prometheus with the remote-write receiver and the rule files;
`Agent` is `dpobs agent`. `Client` talks HTTP from inside a given namespace (a worker thread
that entered it), so the test process itself never joins a node's network.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from dpobs_otel.demo.stack import Managed, die_with_parent, free_port

CLONE_NEWNET = 0x40000000
ROOT = Path(__file__).resolve().parents[2]
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
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
    """HTTP GETs of JSON, made from inside `ns` (None: this process's own namespace)."""

    def __init__(self, ns: Netns | None = None):
        init = (lambda: setns(ns.fd)) if ns is not None else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="netns-client", initializer=init)

    def get(self, url: str, params: dict | None = None, timeout: float = 10):
        return self._pool.submit(_get_json, url, params, timeout).result()

    def text(self, url: str, timeout: float = 2) -> str | None:
        """The body of a 200 answer, or None (refused, timed out, or another status)."""
        return self._pool.submit(_get_text, url, timeout).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _get_text(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:  # urllib's HTTPError and URLError are OSErrors
        return None


def _get_json(url: str, params: dict | None, timeout: float):
    full = url + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(full, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # Prometheus explains a bad query in the body
        return json.load(e)


def rule_files(out_dir: Path, **knobs) -> list[str]:
    """The rule files a central Prometheus loads: the mixin's (with `knobs` as its Config)
    when the package has one, else the committed deploy/prometheus/rules."""
    try:
        from dpobs_otel.mixin import Config, write
    except ImportError:
        return sorted(str(p) for p in (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
    with contextlib.redirect_stdout(io.StringIO()):  # it lists what it wrote
        write(str(out_dir), Config(**knobs))
    return sorted(str(p) for p in (out_dir / "prometheus" / "rules").glob("*.yml"))


class Central(Managed):
    """A central Prometheus: remote-write receiver on, the given rules every `interval`, its
    data kept in `data_dir` across stop()/start() (a restart replays its own WAL)."""

    def __init__(self, rules: list[str], ns: Netns | None = None, port: int | None = None,
                 interval: str = "1s", data_dir: str | None = None,
                 bind: str = "127.0.0.1"):
        self.ns, self.rules, self.interval = ns, rules, interval
        self.port = port or free_port()
        self.bind = bind
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="dpobs-central-"))
        self.proc: subprocess.Popen | None = None
        self.client = Client(ns)
        self.url = f"http://127.0.0.1:{self.port}"  # as seen from inside its namespace

    def start(self, timeout: float = 60) -> None:
        cfg = {"global": {"scrape_interval": self.interval,
                          "evaluation_interval": self.interval},
               "rule_files": self.rules}
        (self.dir / "central.yml").write_text(yaml.safe_dump(cfg))
        argv = ["prometheus", f"--config.file={self.dir / 'central.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.bind}:{self.port}",
                "--web.enable-remote-write-receiver"]
        log = open(self.dir / "central.log", "ab")
        with log:
            if self.ns is not None:
                self.proc = self.ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
            else:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=die_with_parent)
        wait_ready(self.client, self.url, self.proc, timeout, self.log)

    def stop(self) -> None:
        stop(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return (self.dir / "central.log").read_text(errors="replace")[-4000:]

    def api(self, path: str, **params):
        body = self.client.get(f"{self.url}/api/v1/{path}", params)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query: [{"metric": {...}, "value": float, "ts": float}, ...]."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1]), "ts": data["result"][0]}]
        return [{"metric": r["metric"], "value": float(r["value"][1]), "ts": r["value"][0]}
                for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> list[dict]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                        step=str(step))
        return data["result"]


class Agent(Managed):
    """`dpobs agent` in `ns` (or here), in its own session, so stop() or kill() reaches the
    Python wrapper and the prometheus binary it runs."""

    def __init__(self, sd_dir: str, remote_write: str, node: str, ns: Netns | None = None,
                 interval: str = "1s", listen: str | None = None, extra: list[str] = ()):
        self.ns, self.node = ns, node
        self.sd_dir = sd_dir
        self.dir = Path(tempfile.mkdtemp(prefix=f"dpobs-agent-{node}-"))
        self.listen = listen or f"127.0.0.1:{free_port()}"
        self.argv = [sys.executable, "-m", "dpobs_otel.cli", "agent", "--sd-dir", sd_dir,
                     "--remote-write", remote_write, "--node", node,
                     "--scrape-interval", interval, "--listen", self.listen,
                     "--storage-path", str(self.dir / "wal"), "--cleanup-interval", "1",
                     *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.dir / "agent.log", "ab")
        kw = dict(stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with log:
            if self.ns is not None:
                self.proc = self.ns.popen(self.argv, **kw)
            else:
                self.proc = subprocess.Popen(self.argv, preexec_fn=die_with_parent, **kw)

    def kill(self) -> None:
        """SIGKILL to the wrapper and its prometheus: no graceful flush, no stale markers."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "agent.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def wait_ready(client: Client, url: str, proc, timeout: float, log) -> None:
    deadline = time.monotonic() + timeout
    while client.text(f"{url}/-/ready") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become ready:\n{log()}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen | None, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
