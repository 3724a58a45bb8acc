"""A Ray driver under DPOBS_AUTO=1 whose sd_dir should come to hold its Ray node's own exporter
(dpobs_otel/adapters/ray/nodes.py). It records Ray's own account of its node (ray.nodes()),
what the sd_dir holds once the driver's first Ray op started dpobs, what that target serves,
what dpobs's readers list there, and what the sd_dir holds after ray.shutdown().

    python -m helpers.ray_nodes OUT.json            # Ray up, recorded, Ray down, exit
    RAYNODES_HOLD=1 python -m helpers.ray_nodes OUT.json   # OUT.json written, then it waits
                                                    # for stdin to close (a test kills it)

Run by tests/adapters/ray/test_ray_node_targets.py in a subprocess, as a user runs a driver.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from dpobs_otel.readback.scrape import targets

PATTERN = "ray-node-*.json"


def files(sd_dir: str) -> dict[str, list]:
    out = {}
    for path in sorted(glob.glob(os.path.join(sd_dir, PATTERN))):
        try:
            out[os.path.basename(path)] = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            pass  # removed as we read
    return out


def until(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def node_lines(target: str) -> list[str]:
    """The sample lines of Ray's object store series the target serves."""
    def read():
        body = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
        return [line for line in body.splitlines() if line.startswith("ray_object_store_memory")]
    return until(read)


def main() -> None:
    import ray  # here: the tests import this module's helpers without Ray
    sd_dir = os.environ["DPOBS_SD_DIR"]
    ray.init(_node_ip_address="127.0.0.1", address="local", include_dashboard=False,
             num_cpus=1, object_store_memory=80 * 1024**2, log_to_driver=False,
             _system_config={"metrics_report_interval_ms": 200})
    ray.get(ray.put(b"x" * 1024))  # the driver's first Ray op starts dpobs
    out = {"nodes": [{k: n[k] for k in ("NodeID", "NodeManagerAddress", "MetricsExportPort",
                                        "Alive")} for n in ray.nodes()],
           "files": until(lambda: files(sd_dir))}
    listed = [t for doc in out["files"].values() for entry in doc for t in entry["targets"]]
    out["lines"] = {t: node_lines(t) for t in listed}
    out["readers"] = {"processes": sorted(t.address for t in targets(sd_dir)),
                      "stores": sorted(t.address for t in targets(sd_dir, stores=True))}
    if os.environ.get("RAYNODES_HOLD"):
        Path(sys.argv[1]).write_text(json.dumps(out))
        sys.stdin.read()  # until the test kills this driver
        return
    ray.shutdown()
    until(lambda: not files(sd_dir), timeout=10)
    out["after_shutdown"] = files(sd_dir)
    Path(sys.argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
