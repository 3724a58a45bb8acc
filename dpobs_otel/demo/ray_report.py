"""`dpobs demo --backend ray`'s report: Ray's ops per method beside the workload's truth.

The truth (ray_plane.RayTruth): calls the driver made, its own timer around each put, remote
call and get, and Ray's object size of every object they moved
(ray.experimental.get_object_locations); the workers' side of each call (ray_args: the
arguments made ready; ray_return: the results stored) has counts and sizes but no timer of
the workload's (Ray runs that part). The metrics: each process's /metrics at the end, summed
per role. Both count every step, the warm-up included (counters hold it).
"""
from __future__ import annotations

from .. import names as nm

MB = 1e6
# The flags that need the data-plane protocol's store (its puts, gets, rows): Ray's object
# store has none of it. The first is the issue's: the guard does not ride this plane.
UNSUPPORTED = {
    "verify_tensor_hash": "--verify-tensor-hash: the wire guard fingerprints rows on the "
                          "data-plane protocol's puts and gets, and the guard does not ride "
                          "Ray's object store (run it on memory, transferqueue or mooncake)",
    "corrupt_at_step": "--corrupt-at-step: an outside writer rewrites a stored row, and Ray's "
                       "objects are immutable",
    "prefetch": "--prefetch", "async_k": "--async", "weight_sync": "--weight-sync",
    "store_metrics": "--store-metrics", "unmeasured": "--unmeasured", "row_age": "--row-age",
}


def refuse(args) -> None:
    """SystemExit naming the first flag --backend ray cannot honour."""
    for attr, why in UNSUPPORTED.items():
        if getattr(args, attr, None) not in (None, False, 0):
            raise SystemExit(f"dpobs demo: --backend ray does not take {why}")


def _add(into: dict, key, calls, seconds, nbytes, keys) -> None:
    c = into.setdefault(key, [0, None, 0, 0])
    c[0] += calls
    if seconds is not None:
        c[1] = (c[1] or 0.0) + seconds
    c[2] += nbytes or 0
    c[3] += keys


def truth_rows(res) -> dict:
    """{(role, op, method): [calls, seconds or None, bytes, keys]} over every step."""
    out: dict = {}
    for (role, _), period in [*res.warm.items(), *res.truth.items()]:
        for (op, method), v in period.get("ray", {}).items():
            _add(out, (role, op, method), *v)
    return out


def metric_rows(scraped: dict) -> dict:
    """{(role, op, method): [calls, seconds, bytes, keys]} from each process's samples."""
    out: dict = {}
    want = {f"{nm.OP_DURATION_SERIES}_count": 0, f"{nm.OP_DURATION_SERIES}_sum": 1,
            nm.TRANSFERRED_SERIES: 2, nm.KEYS_SERIES: 3}
    for (role, _), samples in scraped.items():
        for name, labels, value in samples:
            op = labels.get("op", "")
            if name in want and op in nm.RAY_OPS:
                row = out.setdefault((role, op, labels.get(nm.RAY_METHOD, "")),
                                     [0, 0.0, 0, 0])
                row[want[name]] += value
    return out


def owned(res) -> float:
    """The driver's dpobs_ray_owned_bytes at the end."""
    return sum(v for k, s in res.scraped.items() if k[0] == "driver"
               for n, _, v in s if n == nm.RAY_OWNED_SERIES)


def report(res, cfg) -> str:
    truth, metrics = truth_rows(res), metric_rows(res.scraped)
    lines = ["\nRay's object store per op and method, every step (truth: the driver's own timer "
             "around each call, Ray's object sizes; metrics: dpobs's, summed per role)",
             f"  {'role':<9}{'op':<11}{'method':<28}{'calls':>7}{'metrics':>8}{'MB':>9}"
             f"{'metrics':>9}{'keys':>6}{'metrics':>8}{'s':>8}{'metrics':>8}{'diff':>7}"]
    for key in sorted(set(truth) | set(metrics)):
        t = truth.get(key, [0, None, 0, 0])
        m = metrics.get(key, [0, 0.0, 0, 0])
        secs = ("" if t[1] is None else f"{t[1]:>8.3f}") or f"{'-':>8}"
        diff = f"{m[1] / t[1] - 1:>+7.1%}" if t[1] else f"{'':>7}"
        lines.append(f"  {key[0]:<9}{key[1]:<11}{key[2] or '-':<28}{t[0]:>7}{int(m[0]):>8}"
                     f"{t[2] / MB:>9.3f}{m[2] / MB:>9.3f}{t[3]:>6}{int(m[3]):>8}{secs}"
                     f"{m[1]:>8.3f}{diff}")
    steps_t = sum(p["steps"] for (r, _), p in [*res.warm.items(), *res.truth.items()]
                  if r == "driver")
    steps_m = sum(v for k, s in res.scraped.items() if k[0] == "driver"
                  for n, _, v in s if n == f"{nm.STEP_DURATION_SERIES}_count")
    lines.append(f"\nDriver steps: {steps_t} (metrics {int(steps_m)}); bytes the driver owns "
                 f"now ({nm.RAY_OWNED_SERIES}): {owned(res) / MB:.3f} MB")
    lines.append("Ray ops are not data-plane time: frac_of_step, busy and exposed leave them "
                 "out (DESIGN.md); the wire guard does not ride this plane.")
    return "\n".join(lines)
