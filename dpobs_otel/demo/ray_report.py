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
from .flags import at_least

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


def add_ray_arguments(p) -> None:
    p.add_argument("--nodes", type=at_least(1), default=1, metavar="N",
                   help="--backend ray: a Ray cluster of N nodes on this machine, each its own "
                        "raylet and object store on 127.0.0.1 (default 1)")


def ray_config(args) -> dict:
    nodes = getattr(args, "nodes", 1)
    if nodes > 1 and args.backend != "ray":
        raise SystemExit("dpobs demo: --nodes needs --backend ray (the other planes run on "
                         "one machine's processes, not a Ray cluster)")
    return {"nodes": nodes}


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


# The ops whose time is moving data (DESIGN.md "Moving data versus waiting"): ray_wait moves
# none; the driver's gets follow a ray.wait, so its timer around each is the get's data time.
DATA_OPS = (nm.RAY_PUT, nm.RAY_CALL, nm.RAY_GET)


def _periods(res, measured_only: bool):
    items = res.truth.items() if measured_only else [*res.warm.items(), *res.truth.items()]
    return list(items)


def truth_data(res) -> tuple[float, float]:
    """The driver's data seconds and step seconds over the measured steps."""
    data = step = 0.0
    for (role, _), p in _periods(res, True):
        if role == "driver":
            step += p["step_s"]
            data += sum(v[1] or 0.0 for (op, _), v in p["ray"].items() if op in DATA_OPS)
    return data, step


def hub_shares(per: dict) -> dict:
    """{process: its share of the job's Ray bytes} from {process: bytes it moved}, as the
    rule reads it (mixin/ray_rules.py): a byte between two measured processes is counted at
    both ends, so the job's bytes are half the sum, and a share is at most 1."""
    total = sum(per.values())
    return {k: min(1.0, 2 * v / total) for k, v in per.items()} if total else {}


def truth_shares(res, measured_only: bool = True) -> dict:
    """{(role, rank): hub share} from the truth's bytes (the measured steps, or all)."""
    per = {}
    for key, p in _periods(res, measured_only):
        per[key] = per.get(key, 0) + sum(v[2] or 0 for v in p["ray"].values())
    return hub_shares(per)


def metric_shares(scraped: dict) -> dict:
    """{(role, rank): hub share} from each process's dpobs_ray_moved_bytes_total (all steps)."""
    return hub_shares({k: sum(v for n, _, v in s if n == nm.RAY_MOVED_SERIES)
                       for k, s in scraped.items()})


def truth_crossed(res) -> tuple[dict, dict]:
    """{(role, op, method): bytes that crossed nodes} and {(op, from, to): bytes}, every step."""
    rows, pairs = {}, {}
    for (role, _), p in _periods(res, False):
        for (op, method, src, dst), nbytes in p.get("crossed", {}).items():
            rows[(role, op, method)] = rows.get((role, op, method), 0) + nbytes
            pairs[(op, src, dst)] = pairs.get((op, src, dst), 0) + nbytes
    return rows, pairs


def metric_moved(scraped: dict, locality: str) -> dict:
    """{(role, op, method): bytes} of one locality, from dpobs_ray_moved_bytes_total."""
    out = {}
    for (role, _), samples in scraped.items():
        for name, labels, value in samples:
            if name == nm.RAY_MOVED_SERIES and labels.get(nm.RAY_LOCALITY) == locality:
                key = (role, labels.get("op", ""), labels.get(nm.RAY_METHOD, ""))
                out[key] = out.get(key, 0) + value
    return out


def _prom(stack, record: str) -> float | None:
    rows = stack.query(record) if stack is not None else []
    return max((r["value"] for r in rows), default=None)


def _fmt(x, spec=".1%") -> str:
    return "-" if x is None else format(x, spec)


def headline(res, stack) -> list[str]:
    """The driver's data time against its step, and where the bytes went, truth beside dpobs."""
    data, step = truth_data(res)
    drv = [s for k, s in res.scraped.items() if k[0] == "driver"]
    data_m = sum(v for s in drv for n, _, v in s if n == nm.RAY_DATA_SERIES)
    step_m = sum(v for s in drv for n, _, v in s if n == f"{nm.STEP_DURATION_SERIES}_sum")
    shares = truth_shares(res)
    hub = max(shares.items(), key=lambda kv: kv[1], default=(("-", 0), None))
    lines = [
        "\nMoving data versus waiting (the driver runs the steps; truth: its own timer around "
        "each put, call and get, each get after a ray.wait that lets its objects exist "
        "unfetched)",
        f"  {'':<34}{'truth':>10}{'metrics':>10}{'prometheus':>12}",
        f"  {'data time, s (measured | all steps)':<34}{data:>10.3f}{data_m:>10.3f}{'':>12}",
        f"  {'frac_of_step':<34}{_fmt(data / step if step else None):>10}"
        f"{_fmt(data_m / step_m if step_m else None):>10}"
        f"{_fmt(_prom(stack, nm.JOB_FRAC_OF_STEP)):>12}",
        f"  {'hub share (' + hub[0][0] + ')':<34}{_fmt(hub[1]):>10}{'':>10}"
        f"{_fmt(_prom(stack, nm.JOB_RAY_HUB_SHARE)):>12}"]
    rows, pairs = truth_crossed(res)
    remote = metric_moved(res.scraped, nm.RAY_REMOTE_LOCALITY)
    unknown = metric_moved(res.scraped, nm.RAY_UNKNOWN)
    lines.append("\nBytes that crossed nodes, every step (truth: Ray's object locations read "
                 f"before each op; metrics: {nm.RAY_MOVED_SERIES} by locality; a worker "
                 "cannot tell where an argument passed by ref was: unknown)")
    lines.append(f"  {'role':<9}{'op':<11}{'method':<28}{'MB':>9}{'remote':>9}{'unknown':>9}")
    for key in sorted(set(rows) | set(remote)):
        lines.append(f"  {key[0]:<9}{key[1]:<11}{key[2] or '-':<28}{rows.get(key, 0) / MB:>9.3f}"
                     f"{remote.get(key, 0) / MB:>9.3f}{unknown.get(key, 0) / MB:>9.3f}")
    for (op, src, dst), nbytes in sorted(pairs.items()):
        lines.append(f"  {op:<10} node {src[:8]} -> {dst[:8]}: {nbytes / MB:.3f} MB")
    return lines


def report(res, cfg, stack=None) -> str:
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
    lines.extend(headline(res, stack))
    lines.append("A Ray op's data time (moving data: serializing, storing, fetching, "
                 "deserializing) is data-plane time; its wait for a producer is not. The wire "
                 "guard does not ride this plane.")
    return "\n".join(lines)
