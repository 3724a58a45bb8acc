"""A private Prometheus and Alertmanager for the demo and the end-to-end test: the deploy/
configs rewritten for loopback (file_sd -> the demo's directory, rule files by absolute path,
the local Alertmanager, 1s intervals), free ports, a temporary data directory, and a small
client for the HTTP APIs. Everything started is stopped, and the directory removed, by
close(), which also runs on Ctrl-C (the servers live in their own session, so the terminal's
SIGINT reaches only the demo, which then stops them after its final queries)."""
from __future__ import annotations

import ctypes
import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

from dpobs_otel.mixin.tree import default_servers

DEPLOY = default_servers()  # the package's rules and configs, not a checkout's deploy/
ALERTMANAGER_NAMES = ("alertmanager", "prometheus-alertmanager")  # upstream, Debian


class StackError(RuntimeError):
    pass


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies, so nothing
    outlives a demo or test that was killed outright. A no-op elsewhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def binaries() -> dict[str, str | None]:
    am = next(filter(None, map(shutil.which, ALERTMANAGER_NAMES)), None)
    return {"prometheus": shutil.which("prometheus"), "alertmanager": am}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def prometheus_config(sd_dir: str, alertmanager: str, interval: str = "1s",
                      deploy: Path = DEPLOY) -> dict:
    """deploy/prometheus/prometheus.yml, pointed at this machine's files and ports."""
    cfg = yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text())
    cfg.setdefault("global", {}).update(scrape_interval=interval, evaluation_interval=interval)
    cfg["rule_files"] = sorted(str(p) for p in (deploy / "prometheus" / "rules").glob("*.yml"))
    for am in cfg["alerting"]["alertmanagers"]:
        am["static_configs"] = [{"targets": [alertmanager]}]
    sd = [c for sc in cfg["scrape_configs"] for c in sc.get("file_sd_configs", [])]
    if not sd:
        raise StackError("deploy/prometheus/prometheus.yml has no file_sd_configs")
    for c in sd:
        c["files"] = [str(Path(sd_dir) / "*.json")]
        c["refresh_interval"] = interval
    return cfg


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


class Stack(Managed):
    """`with Stack() as st:` a running Prometheus (st.prometheus) and Alertmanager
    (st.alertmanager) scraping every file_sd target written into st.sd_dir."""

    def __init__(self, sd_dir: str | None = None, interval: str = "1s", deploy: Path = DEPLOY):
        self.interval = interval
        self.deploy = deploy
        self._sd_dir = sd_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmp: str | None = None

    def start(self, timeout: float = 60) -> None:
        bins = binaries()
        missing = [name for name, path in bins.items() if path is None]
        if missing:
            raise StackError(f"not on PATH: {', '.join(missing)} (Debian: apt-get install "
                             "prometheus prometheus-alertmanager)")
        self.tmp = tempfile.mkdtemp(prefix="dpobs-stack-")
        tmp = Path(self.tmp)
        self.sd_dir = self._sd_dir or str(tmp / "file_sd")
        Path(self.sd_dir).mkdir(parents=True, exist_ok=True)
        self.alertmanager = f"http://127.0.0.1:{free_port()}"
        self._spawn("alertmanager", [
            bins["alertmanager"],
            f"--config.file={self.deploy / 'alertmanager' / 'alertmanager.yml'}",
            f"--storage.path={tmp / 'alertmanager'}",
            f"--web.listen-address={self.alertmanager[7:]}",
            "--cluster.listen-address="])  # no gossip port: one private instance
        cfg = prometheus_config(self.sd_dir, self.alertmanager[7:], self.interval, self.deploy)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.prometheus = f"http://127.0.0.1:{free_port()}"
        self._spawn("prometheus", [
            bins["prometheus"], f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'prometheus'}",
            f"--web.listen-address={self.prometheus[7:]}"])
        for name, url in (("alertmanager", self.alertmanager), ("prometheus", self.prometheus)):
            self._wait_ready(name, url, timeout)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(Path(self.tmp) / f"{name}.log", "wb")
        with log:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent)

    def _wait_ready(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                return
            except OSError:
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    raise StackError(f"{name} did not start:\n{self.log(name)}") from None
                time.sleep(0.2)

    def log(self, name: str, tail: int = 4000) -> str:
        try:
            return (Path(self.tmp) / f"{name}.log").read_text(errors="replace")[-tail:]
        except (OSError, TypeError):
            return ""

    def close(self) -> None:
        """Stop both servers and remove the data directory. Idempotent."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    # -- HTTP APIs ------------------------------------------------------------------------
    @staticmethod
    def get(url: str, params: dict | None = None):
        full = url + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(full, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # Prometheus explains a bad query in the body
            return json.load(e)

    def api(self, path: str, **params):
        body = self.get(f"{self.prometheus}/api/v1/{path}", params)
        if body.get("status") != "success":
            raise StackError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query: [{"metric": {...}, "value": float}, ...]."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]

    def alerts(self) -> list[dict]:
        """What Alertmanager holds (its v2 API)."""
        return self.get(f"{self.alertmanager}/api/v2/alerts")

    def wait_scraped(self, instances, after: float, timeout: float = 30) -> None:
        """Until every instance has been scraped, healthy, by a scrape that began after the
        wall-clock time `after`: its samples then hold the state as of `after`."""
        want = set(instances)
        deadline = time.monotonic() + timeout
        while True:
            done = {t["labels"].get("instance") for t in self.targets()
                    if t["health"] == "up" and _ts(t["lastScrape"]) > after}
            if want <= done:
                return
            if time.monotonic() > deadline:
                raise StackError(f"not scraped since {after}: {sorted(want - done)}")
            time.sleep(0.2)

    def wait_evaluated(self, after: float, timeout: float = 30) -> None:
        """Until every rule group has finished an evaluation that began after `after`."""
        deadline = time.monotonic() + timeout
        while True:
            groups = self.api("rules")["groups"]
            if groups and all(_ts(g["lastEvaluation"]) > after for g in groups):
                return
            if time.monotonic() > deadline:
                raise StackError(f"rules not evaluated since {after}")
            time.sleep(0.2)


def _ts(rfc3339: str) -> float:
    """A Prometheus timestamp (RFC 3339, nanoseconds, any zone) as epoch seconds."""
    m = re.fullmatch(r"(.+T[\d:]+)(\.\d+)?(Z|[+-][\d:]+)", rfc3339)
    if m is None:
        raise StackError(f"not an RFC 3339 timestamp: {rfc3339!r}")
    zone = "+00:00" if m[3] == "Z" else m[3]
    return datetime.fromisoformat(m[1] + zone).timestamp() + float(m[2] or 0)
