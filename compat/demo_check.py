"""`dpobs demo --backend transferqueue --steps 30`, run as the command runs it (its own
defaults; no Prometheus stack), its report printed, then its truth columns checked:

  * each op: the calls the metrics count equal the workload's own count, and the bytes
    equal its byte count within 1%;
  * each process: the fraction of step time in the data plane from the metrics within one
    percentage point of the workload's clock (the slack tests/demo/test_compare.py gives).

Exits 1 naming every column that is off. Run by `make compat` in each cell."""
from __future__ import annotations

import argparse
import sys

from dpobs_otel import names as nm
from dpobs_otel.demo import report as demo
from dpobs_otel.demo.command import add_arguments
from dpobs_otel.demo.logs import BackendLog, log_dir

BYTES_REL = 0.01
FRAC_ABS = 0.01


def check(res) -> list[str]:
    keys = list(res.info)
    total = demo.merge(res.total(k) for k in keys)
    mops = demo.metric_ops([s for k in keys for s in res.scraped[k]])
    bad = []
    for op, d in total["ops"].items():
        m = mops.get(op, {"calls": 0, "bytes": 0})
        nbytes = sum(v for (o, _), v in total["bytes"].items() if o == op)
        if m["calls"] != len(d):
            bad.append(f"{op}: {m['calls']:.0f} calls counted, the workload made {len(d)}")
        if abs(m["bytes"] - nbytes) > BYTES_REL * nbytes:
            bad.append(f"{op}: {m['bytes']:.0f} bytes counted, the workload moved {nbytes}")
    for k in keys:
        t, s = res.total(k), res.scraped[k]
        step_s = demo.metric_sum(s, f"{nm.STEP_DURATION_SERIES}_sum")
        dp_s = demo.metric_sum(s, f"{nm.OP_DURATION_SERIES}_sum")
        metric = dp_s / step_s if step_s else 0.0
        if abs(metric - demo.frac_of_step(t)) > FRAC_ABS:
            bad.append(f"{k[0]} {k[1]}: data-plane fraction of step {metric:.3f} from the "
                       f"metrics, {demo.frac_of_step(t):.3f} by the workload's clock")
    return bad


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--backend", "transferqueue", "--steps", "30", "--stack", "off",
                         *argv])
    cfg = demo.config(args)
    with BackendLog(log_dir(args.log_dir), cfg.backend) as backend:
        with demo.session(cfg) as res:
            print(demo.report(res, None, cfg), file=backend.out, flush=True)
            bad = check(res)
    ops = ", ".join(f"{op} {len(d)}" for op, d in demo.merge(
        res.total(k) for k in res.info)["ops"].items())
    if bad:
        print("demo truth check FAILED:\n  " + "\n  ".join(bad))
        return 1
    print(f"demo truth check ok: calls and bytes of every op ({ops}) and each of "
          f"{len(res.info)} processes' data-plane fraction match the workload's truth")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
