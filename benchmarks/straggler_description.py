"""What DpobsDataPlaneStraggler's description cost while it ran a query (issue 57): one
Prometheus (2.42) evaluates two copies of the alert each in a group of its own, the shipped
one (no query) and the one from before issue 57 (a `query` of the process's own mean in the
description), over the same per-process means of 1024 processes, a tenth of them
stragglers, and the rules API's evaluation times of the two groups are compared.

The per-process means are served as they are (one gauge per process and op, labels honoured),
so the alert's input is what a central Prometheus holds, without the endpoints.

    unshare --net sh -c 'ip link set lo up; exec env PYTHONPATH=$PWD .venv/bin/python benchmarks/straggler_description.py [WINDOW_S [SLOW_EVERY]]'

(SLOW_EVERY 0: no stragglers, the expression's cost alone.)
"""
from __future__ import annotations

import http.server
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from dpobs_otel import names as n
from dpobs_otel.mixin.alerts import alerts_file
from dpobs_otel.mixin.config import DEFAULT
from dpobs_otel.readback.prometheus import Prometheus
from dpobs_otel.testing.processes import free_port

PROCESSES, OPS, SLOW_EVERY = 1024, ("get", "put", "ray_args", "ray_return"), 10
BEFORE = ('{{ $labels.op }} calls by {{ $labels.role }} rank {{ $labels.rank }} '
          '({{ $labels.instance }}, job {{ $labels.job }}) take {{ with printf '
          f'"{n.INSTANCE_OP_MEAN}'
          '{job=%q,node=%q,instance=%q,role=%q,rank=%q,op=%q}" $labels.job $labels.node '
          '$labels.instance $labels.role $labels.rank $labels.op | query }}{{ . | first | '
          'value | humanizeDuration }}{{ end }} on average, {{ $value | printf "%.3g" }}x '
          "the median of its role's processes.")


def exposition(slow_every: int) -> bytes:
    """Every `slow_every`-th process 10x slower (0: none)."""
    lines = []
    for p in range(PROCESSES):
        role = "rollout" if p % 2 else "worker"
        slow = 10.0 if slow_every and p % slow_every == 0 else 1.0
        for op in OPS:
            lines.append(f'{n.INSTANCE_OP_MEAN}{{job="j",node="n{p // 8}",'
                         f'instance="127.0.0.1:{9000 + p % 8}",role="{role}",rank="{p}",'
                         f'op="{op}"}} {0.01 * slow}')
    return ("\n".join(lines) + "\n").encode()


def rule_files(tmp: Path) -> list[str]:
    shipped = next(r for g in yaml.safe_load(alerts_file(DEFAULT))["groups"]
                   for r in g["rules"] if r.get("alert") == n.ALERT_STRAGGLER)
    before = dict(shipped, annotations=dict(shipped["annotations"], description=BEFORE))
    paths = []
    for name, rule in (("shipped", shipped), ("before", before)):
        path = tmp / f"{name}.rules.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": name, "rules": [rule]}]}))
        paths.append(str(path))
    return paths


def main(window: float = 90, slow_every: int = SLOW_EVERY) -> None:
    body = exposition(slow_every)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="dpobs-straggler-"))
    port = free_port()
    (tmp / "p.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": rule_files(tmp),
        "scrape_configs": [{"job_name": "means", "honor_labels": True, "static_configs": [
            {"targets": [f"127.0.0.1:{server.server_address[1]}"]}]}]}))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'p.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stderr=subprocess.DEVNULL)
    prom = Prometheus(f"http://127.0.0.1:{port}", timeout=10)
    try:
        time.sleep(20)  # the first scrapes and evaluations
        seconds: dict[str, list[float]] = {"shipped": [], "before": []}
        active = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < window:
            for g in prom.api("rules")["groups"]:
                seconds[g["name"]].append(g["evaluationTime"])
                active = max(active, len(g["rules"][0].get("alerts", [])))
            time.sleep(5)
        print(f"{PROCESSES} processes x {len(OPS)} ops, {active} straggler alerts pending; "
              "mean / max seconds per evaluation of the alert's group:")
        for name, got in seconds.items():
            print(f"  {name:8s} {statistics.mean(got):.4f} / {max(got):.4f} "
                  f"({len(got)} samples)")
    finally:
        proc.terminate()
        proc.wait()
        server.shutdown()


if __name__ == "__main__":
    main(*(f(a) for f, a in zip((float, int), sys.argv[1:])))
