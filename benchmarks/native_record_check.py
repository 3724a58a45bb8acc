"""Can a native histogram's rate be recorded on this Prometheus? (issue 22 item 5)

The native quantile rules each rate every process's native histogram over 5m themselves;
recording that rate once would let the three read it. This records four candidate layouts,
each in a rule group of its own, from six dpobs processes that keep recording latencies,
and counts how many evaluations the TSDB kept against how many ran. Prometheus 2.42
discards a float histogram whose buckets add up to more than its count, and a scaled rate
rounds its buckets and its count separately, so a kept fraction under 1 means the layout
loses samples and cannot be recorded.

    unshare --net sh -c 'ip link set lo up; exec .venv/bin/python benchmarks/native_record_check.py [SECONDS]'
"""
from __future__ import annotations

import math
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import dpobs_otel as dpobs
from dpobs_otel import names as n
from dpobs_otel.testing.prometheus import Central, rule_files

NATIVE = n.OP_DURATION_NATIVE_SERIES
LAYOUTS = {
    "sum_rate": f"sum by (job, op) (rate({NATIVE}[5m]))",
    "per_process_rate": f"rate({NATIVE}[5m])",
    "sum_increase": f"sum by (job, op) (increase({NATIVE}[5m]))",
    "sum_rate_1m": f"sum by (job, op) (rate({NATIVE}[1m]))",
}


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
    tmp = Path(tempfile.mkdtemp(prefix="dpobs-native-record-"))
    sd = tmp / "sd"
    sd.mkdir()
    extra = tmp / "candidates.rules.yml"
    extra.write_text("groups:\n" + "".join(
        f"- name: {k}\n  rules:\n  - record: check:{k}\n    expr: {v}\n"
        for k, v in LAYOUTS.items()))
    tels = [dpobs.start(role="w", rank=i, port=0, sd_dir=str(sd)) for i in range(6)]
    done = threading.Event()

    def work(tel, median: float, sigma: float, seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            for op in ("get", "put"):
                for _ in range(rng.randint(1, 40)):
                    tel.op_duration.record(math.exp(rng.gauss(math.log(median), sigma)),
                                           tel.op_attrs[op])
            time.sleep(0.05)

    for i, tel in enumerate(tels):
        threading.Thread(target=work, args=(tel, 0.001 * (i + 1), 0.3 + 0.1 * i, i),
                         daemon=True).start()
    rules = rule_files(tmp / "mixin", classic_quantiles=False) + [str(extra)]
    try:
        with Central(rules, scrape_sd=str(sd), interval="1s") as prom:
            time.sleep(seconds)
            text = prom.client.text(f"{prom.url}/metrics", timeout=10)
            log = (prom.dir / "central.log").read_text(errors="replace")
            discarded = Counter(m.group(1) for m in re.finditer(
                r"name=check:(\w+) .*?Rule evaluation result discarded", log))
            for k in LAYOUTS:
                evals = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith("prometheus_rule_evaluations_total")
                            and f';{k}"' in line)
                kept = [r["value"] for r in prom.query(f"count_over_time(check:{k}[10m])")]
                print(f"{k:18} evaluations {evals:.0f}, samples kept per series "
                      f"{min(kept, default=0):.0f}..{max(kept, default=0):.0f}, "
                      f"series discarded {discarded[k]} times")
            print("for example:", next((line for line in log.splitlines()
                                        if "check:" in line and "discarded" in line), "-")[:400])
    finally:
        done.set()
        for tel in tels:
            tel.shutdown()


if __name__ == "__main__":
    main()
