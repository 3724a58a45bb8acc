"""The demo's private Prometheus and Alertmanager (`dpobs demo`, `dpobs compare`, the
end-to-end test): the deploy/ configs rewritten for loopback (file_sd -> the demo's
directory, rule files by absolute path, the local Alertmanager, 1s intervals), free ports, a
temporary data directory, and its HTTP APIs (Prometheus's through readback/prometheus.py,
the one client). Everything started is stopped, and the directory removed, by close(),
which also runs on Ctrl-C (the servers live in their own session, so the terminal's SIGINT
reaches only the demo, which then stops them after its final queries)."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from dpobs_otel.mixin.tree import default_servers, servers
from dpobs_otel.readback.prometheus import Prometheus, timestamp
from dpobs_otel.testing.prometheus import NATIVE_HISTOGRAMS_FLAG

from .processes import Managed, die_with_parent, free_port

DEPLOY = default_servers()  # the package's rules and configs, not a checkout's deploy/
ALERTMANAGER_NAMES = ("alertmanager", "prometheus-alertmanager")  # upstream, Debian


class StackError(RuntimeError):
    pass


def binaries() -> dict[str, str | None]:
    am = next(filter(None, map(shutil.which, ALERTMANAGER_NAMES)), None)
    return {"prometheus": shutil.which("prometheus"), "alertmanager": am}


def prometheus_config(sd_dir: str, alertmanager: str, interval: str = "1s",
                      deploy: Path = DEPLOY, itself: str | None = None,
                      rules: list[str] = ()) -> dict:
    """deploy/prometheus/prometheus.yml, pointed at this machine's files and ports (`itself`:
    the Prometheus's own host:port, which its self-scrape job targets), with `rules` loaded
    beside the shipped rule files."""
    cfg = yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text())
    cfg.setdefault("global", {}).update(scrape_interval=interval, evaluation_interval=interval)
    cfg["rule_files"] = sorted(str(p) for p in (deploy / "prometheus" / "rules").glob("*.yml"))
    cfg["rule_files"] += list(rules)
    for sc in cfg["scrape_configs"]:
        for static in sc.get("static_configs", []) if itself else ():
            static["targets"] = [itself]
    for am in cfg["alerting"]["alertmanagers"]:
        am["static_configs"] = [{"targets": [alertmanager]}]
    sd = [c for sc in cfg["scrape_configs"] for c in sc.get("file_sd_configs", [])]
    if not sd:
        raise StackError("deploy/prometheus/prometheus.yml has no file_sd_configs")
    for c in sd:
        c["files"] = [str(Path(sd_dir) / "*.json")]
        c["refresh_interval"] = interval
    return cfg


class Stack(Managed):
    """`with Stack() as st:` a running Prometheus (st.prometheus) and Alertmanager
    (st.alertmanager) scraping every file_sd target written into st.sd_dir. `mixin`: a mixin
    Config of its own (knobs of a run that lasts minutes), its files written into the stack's
    directory, in place of `deploy`'s."""

    def __init__(self, sd_dir: str | None = None, interval: str = "1s", deploy: Path = DEPLOY,
                 mixin=None, rules: list[str] = ()):
        self.interval = interval
        self.deploy = deploy
        self.mixin = mixin
        self.rules = list(rules)  # rule files loaded beside the mixin's
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
        if self.mixin is not None:
            self.deploy = tmp / "mixin"
            for rel, text in servers(self.mixin).items():  # quietly: not `dpobs mixin`'s output
                (self.deploy / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.deploy / rel).write_text(text)
        self.alertmanager = f"http://127.0.0.1:{free_port()}"
        self._spawn("alertmanager", [
            bins["alertmanager"],
            f"--config.file={self.deploy / 'alertmanager' / 'alertmanager.yml'}",
            f"--storage.path={tmp / 'alertmanager'}",
            f"--web.listen-address={self.alertmanager[7:]}",
            "--cluster.listen-address="])  # no gossip port: one private instance
        self.prometheus = f"http://127.0.0.1:{free_port()}"
        cfg = prometheus_config(self.sd_dir, self.alertmanager[7:], self.interval, self.deploy,
                                itself=self.prometheus[7:], rules=self.rules)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.prom = Prometheus(self.prometheus, timeout=10)
        self._spawn("prometheus", [
            bins["prometheus"], f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'prometheus'}",
            f"--web.listen-address={self.prometheus[7:]}", NATIVE_HISTOGRAMS_FLAG])
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

    # -- HTTP APIs: Prometheus's through the one client (readback/prometheus.py) ------------
    def api(self, path: str, **params):
        return self.prom.api(path, **params)

    def query(self, expr: str) -> list[dict]:
        """An instant query: [{"metric": {...}, "value": float, "ts": float}, ...]."""
        return self.prom.query(expr)

    def targets(self) -> list[dict]:
        return self.prom.targets()

    def alerts(self) -> list[dict]:
        """What Alertmanager holds (its v2 API)."""
        with urllib.request.urlopen(f"{self.alertmanager}/api/v2/alerts", timeout=10) as r:
            return json.load(r)

    def wait_alerts(self, want: set[str], timeout: float = 60) -> list[dict]:
        """alerts() once every alert named in `want` is among them, or at the timeout (what
        is there then: the caller reports, it does not fail)."""
        deadline = time.monotonic() + timeout
        while True:
            alerts = self.alerts()
            if want <= {a["labels"]["alertname"] for a in alerts} or time.monotonic() > deadline:
                return alerts
            time.sleep(0.5)

    def wait_scraped(self, instances, after: float, timeout: float = 30) -> None:
        """Until every instance has been scraped, healthy, by a scrape that began after the
        wall-clock time `after`: its samples then hold the state as of `after`."""
        want = set(instances)
        deadline = time.monotonic() + timeout
        while True:
            done = {t["labels"].get("instance") for t in self.targets()
                    if t["health"] == "up" and later_than(t["lastScrape"], after)}
            if want <= done:
                return
            if time.monotonic() > deadline:
                raise StackError(f"not scraped since {after}: {sorted(want - done)}")
            time.sleep(0.2)

    def wait_evaluated(self, after: float, timeout: float = 30) -> None:
        """Until every rule group has finished an evaluation that began after `after`."""
        deadline = time.monotonic() + timeout
        while True:
            groups = self.prom.rules()
            if groups and all(later_than(g["lastEvaluation"], after) for g in groups):
                return
            if time.monotonic() > deadline:
                raise StackError(f"rules not evaluated since {after}")
            time.sleep(0.2)


def later_than(rfc3339: str, after: float) -> bool:
    """Whether an answer's time is later than `after` (the zero time, never, is not)."""
    at = timestamp(rfc3339)
    return at is not None and at > after
