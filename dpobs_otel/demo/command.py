"""`dpobs demo`'s flags, apart from the demo itself: `dpobs demo --help` (and a mistyped
flag) answers without importing torch, the workload or the report (report.py, imported by
run() only)."""
from __future__ import annotations

import argparse

from ..tracing.command import add_trace_flag
from .backends import BACKENDS
from .flags import at_least
from .queue import add_queue_arguments
from .ray_report import add_ray_arguments
from .store_report import add_store_arguments
from .weightsync_report import add_weight_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="memory", help="the data plane "
                   "the workload runs on (default memory: the embedded store)")
    p.add_argument("--job", help="Prometheus job label (default: DPOBS_JOB, else dpobs)")
    p.add_argument("--steps", type=at_least(1), default=200, help="measured steps (default 200)")
    p.add_argument("--trainers", type=at_least(1), default=2, help="trainer processes (default 2)")
    p.add_argument("--batch-size", type=at_least(1), default=64, help="rows per step (default 64)")
    p.add_argument("--min-len", type=at_least(1), default=64, help="shortest sequence (tokens)")
    p.add_argument("--max-len", type=at_least(1), default=512, help="longest sequence (tokens)")
    p.add_argument("--store-latency-ms", type=at_least(0.0), default=5.0,
                   help="service time the memory store adds to every call (default 5)")
    p.add_argument("--verify-tensor-hash", action="store_true",
                   help="turn on the wire guard (dpobs.start(verify_tensor_hash=True))")
    p.add_argument("--corrupt-at-step", type=at_least(0), default=None, metavar="N",
                   help="an uninstrumented writer rewrites one row at measured step N")
    p.add_argument("--prefetch", action="store_true",
                   help="the rollout runs one step ahead and each trainer reads its next shard "
                        "on a thread while it trains (exposed time falls below busy time)")
    p.add_argument("--rollout-ms", type=at_least(0.0), default=0.0, metavar="MS",
                   help="compute per step of the rollout, before its put (default 0)")
    p.add_argument("--train-ms", type=at_least(0.0), default=0.0, metavar="MS",
                   help="compute per step of each trainer, after its reads (default 0)")
    add_queue_arguments(p)
    add_weight_arguments(p)
    add_store_arguments(p)
    add_ray_arguments(p)
    p.add_argument("--duration", type=at_least(0.0), default=None, metavar="SECONDS",
                   help="run this long instead of --steps; 0 = until stopped")
    p.add_argument("--stack", choices=("auto", "off"), default="auto",
                   help="auto: start Prometheus and Alertmanager when on PATH (default)")
    p.add_argument("--sd-dir", default=None, help="directory for the file_sd target files")
    p.add_argument("--cluster-log", default=None, metavar="FILE",
                   help="append every step's cluster dict (tel.cluster_step_metrics) to FILE "
                        "as JSON lines (needs a file_sd directory: --sd-dir or the stack)")
    p.add_argument("--host", default="127.0.0.1", help="bind the /metrics endpoints here")
    p.add_argument("--advertise-host", default=None, metavar="NAME",
                   help="host name written into file_sd (when --host is a wildcard)")
    add_trace_flag(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None, metavar="DIR", help="where the backend's own "
                   "logs (and --trace's files) go (default: a new folder under the temp dir)")


def run(args) -> int:
    from .report import run as run_demo
    return run_demo(args)
