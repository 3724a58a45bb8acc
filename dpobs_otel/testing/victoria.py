"""Loopback VictoriaMetrics for the receiver tests (tests/agent/test_victoria.py), from the
Debian package's binaries: `VictoriaMetrics` is the single-node server (remote write at
/api/v1/write, the Prometheus query API, which the inherited client reads), `VMAlert`
evaluates the mixin's rule files against it and writes what it records back into it.
Nothing starts until start() (or `with`).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from ..readback.prometheus import Prometheus
from .processes import Managed, die_with_parent, free_port, stop


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def _wait_ok(proc: subprocess.Popen, url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


class VictoriaMetrics(Managed, Prometheus):
    """Single-node VictoriaMetrics on 127.0.0.1, its data kept in `data_dir` across
    stop()/start()."""

    def __init__(self, port: int | None = None, data_dir: str | None = None):
        self.port = port or free_port()
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="dpobs-vm-"))
        self.proc: subprocess.Popen | None = None
        Prometheus.__init__(self, f"http://127.0.0.1:{self.port}", timeout=10)

    def start(self, timeout: float = 60) -> None:
        # latencyOffset 0: the default hides the newest 30 s from queries, which a test that
        # reads back what it just wrote cannot wait out
        argv = ["victoria-metrics", f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-storageDataPath={self.dir / 'data'}", "-search.latencyOffset=0s",
                "-search.disableCache"]
        self.proc = _spawn(argv, self.dir / "vm.log")
        _wait_ok(self.proc, f"{self.url}/health", timeout, self.dir / "vm.log")

    def flush(self) -> None:
        """Make everything ingested so far searchable now (its buffers flush every ~1 s)."""
        urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=10).close()

    def stop(self) -> None:
        stop(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return (self.dir / "vm.log").read_text(errors="replace")[-4000:]


class VMAlert(Managed):
    """vmalert over `rules` against `vm`: recording results remote-written back into it,
    alert state as ALERTS series there too; notifications go to `notifier` (a URL)."""

    def __init__(self, vm: VictoriaMetrics, rules: list[str], notifier: str,
                 interval: str = "1s"):
        self.vm, self.rules, self.notifier, self.interval = vm, rules, notifier, interval
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="dpobs-vmalert-"))
        self.proc: subprocess.Popen | None = None
        self.api = Prometheus(f"http://127.0.0.1:{self.port}", timeout=10)

    def start(self, timeout: float = 60) -> None:
        argv = ["vmalert", f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-datasource.url={self.vm.url}", f"-remoteWrite.url={self.vm.url}",
                f"-notifier.url={self.notifier}", f"-evaluationInterval={self.interval}",
                "-remoteWrite.flushInterval=1s",
                *(f"-rule={r}" for r in self.rules)]
        self.proc = _spawn(argv, self.dir / "vmalert.log")
        _wait_ok(self.proc, f"http://127.0.0.1:{self.port}/-/healthy", timeout,
                 self.dir / "vmalert.log")

    def close(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return (self.dir / "vmalert.log").read_text(errors="replace")[-4000:]
