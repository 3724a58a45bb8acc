"""Loopback Prometheus processes for the multi-node test, the agent tests and the scale
benchmark, from the real binaries: `Central` is a Prometheus with the remote-write receiver
and the mixin's rule files (and, being one, the readback client of itself); `Agent` is
`dpobs agent`. Either runs here or inside a `Netns` (netns.py), where a central is queried
from a thread that entered that namespace. Nothing starts until start() (or `with`).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ..readback.prometheus import Prometheus
from .netns import Client, Netns
from .processes import Managed, die_with_parent, free_port, stop


def rule_files(out_dir: Path, **knobs) -> list[str]:
    """The rule files a central Prometheus loads: the mixin's, with `knobs` as its Config,
    written under out_dir."""
    from ..mixin.config import Config
    from ..mixin.tree import servers
    paths = []
    for rel, text in servers(Config(**knobs)).items():
        if rel.startswith("prometheus/rules/"):
            path = Path(out_dir) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            paths.append(str(path))
    return sorted(paths)


# Prometheus 2.x ingests native histograms (and asks for the protobuf exposition) only with
# this flag; 3.x ignores it with a warning (docs/native-histograms.md).
NATIVE_HISTOGRAMS_FLAG = "--enable-feature=native-histograms"


class Central(Managed, Prometheus):
    """A central Prometheus: remote-write receiver on, the given rules every `interval`, its
    data kept in `data_dir` across stop()/start() (a restart replays its own WAL). Its
    query API is the inherited client's (query, query_range, api, ...). Native histograms
    on unless native=False; with scrape_sd it also scrapes the file_sd targets there."""

    def __init__(self, rules: list[str], ns: Netns | None = None, port: int | None = None,
                 interval: str = "1s", data_dir: str | None = None,
                 bind: str = "127.0.0.1", native: bool = True, scrape_sd: str | None = None):
        # not self.rules: that is the inherited client's rules API
        self.ns, self.rule_files, self.interval = ns, rules, interval
        self.native, self.scrape_sd = native, scrape_sd
        self.port = port or free_port()
        self.bind = bind
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="dpobs-central-"))
        self.proc: subprocess.Popen | None = None
        self.client = Client(ns)
        # the URL as seen from inside its namespace, where the client's thread asks
        Prometheus.__init__(self, f"http://127.0.0.1:{self.port}", timeout=10,
                            executor=self.client.pool)

    def start(self, timeout: float = 60) -> None:
        cfg = {"global": {"scrape_interval": self.interval,
                          "evaluation_interval": self.interval},
               "rule_files": self.rule_files}
        if self.scrape_sd:
            cfg["scrape_configs"] = [{"job_name": "dpobs", "file_sd_configs": [
                {"files": [f"{self.scrape_sd}/*.json"], "refresh_interval": "1s"}]}]
        (self.dir / "central.yml").write_text(yaml.safe_dump(cfg))
        argv = ["prometheus", f"--config.file={self.dir / 'central.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.bind}:{self.port}",
                "--web.enable-remote-write-receiver"] + ([NATIVE_HISTOGRAMS_FLAG] * self.native)
        log = open(self.dir / "central.log", "ab")
        with log:
            if self.ns is not None:
                self.proc = self.ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
            else:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.url} did not become ready:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        stop(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return (self.dir / "central.log").read_text(errors="replace")[-4000:]


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
