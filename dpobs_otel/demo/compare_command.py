"""`dpobs compare`'s flags, apart from the run: `dpobs compare --help` answers without
importing torch or the demo (compare.py, imported by run() only)."""
from __future__ import annotations

import argparse

from .backends import BACKENDS
from .flags import at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, of " + ", ".join(BACKENDS) + " (default: every one "
                        "this machine has)")
    p.add_argument("--steps", type=at_least(1), default=60, help="measured steps per backend")
    p.add_argument("--trainers", type=at_least(1), default=2)
    p.add_argument("--batch-size", type=at_least(1), default=64)
    p.add_argument("--store-latency-ms", type=at_least(0.0), default=0.0,
                   help="service time the memory store adds (default 0: its own speed)")
    p.add_argument("--verify-tensor-hash", action="store_true",
                   help="run every backend with the wire guard on")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="where each backend's own logs go, a file per backend (default: a "
                        "new folder under the temp dir)")


def run(args) -> int:
    from .compare import run as run_compare
    return run_compare(args)
