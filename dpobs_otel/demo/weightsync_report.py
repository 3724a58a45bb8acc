"""`dpobs demo --weight-sync`: its flags, the demo stack's knobs for it, and the report's
"Weight sync" section: per side, sync time, bandwidth and tensors from each process's
/metrics beside the workload's own clock and byte count (weightsync.py); the slowest
receiver; the share of the trainer's step; tensors checked and mismatched beside the
rollout's own comparison; and, with the stack, the weight-sync recording rules beside the
truth of the measured steps."""
from __future__ import annotations

import dataclasses
import sys

from .. import names as nm
from ..mixin import DEFAULT as MIXIN
from ..readback.weights import Side, WeightTotals
from .flags import at_least

MB = 1e6
# The demo's Prometheus holds DpobsWeightsStale this long, not the shipped 5m: a demo run
# lasts minutes. A lockstep run is at most the version in flight behind (1, the knob), so
# no hold is needed to keep a clean run quiet; this one still shows the alert pending first.
STALE_FOR = "5s"
# --weight-sync's transports (weightsync.py builds one of each; named here, where the
# flag is, so that `dpobs demo --help` imports no torch)
TRANSPORTS = ("gloo", "mooncake")


def add_weight_arguments(p) -> None:
    p.add_argument("--weight-sync", choices=TRANSPORTS, default=None,
                   help="after each optimizer step trainer 0 pushes a small model's weights "
                        "(39 bf16 tensors, 63 MB) to the rollout over this transport: gloo "
                        "(torch.distributed between the demo's processes) or mooncake "
                        "(Mooncake's TransferEngine over TCP), measured on both sides "
                        "(tel.weights) and, with "
                        "--verify-tensor-hash, checked tensor by tensor")
    p.add_argument("--corrupt-weights-at", type=at_least(0), default=None, metavar="N",
                   help="at measured step N one weight element is flipped on the rollout's "
                        f"side in flight ({nm.ALERT_WEIGHTS_MISMATCH}, with "
                        "--verify-tensor-hash)")
    p.add_argument("--skip-weight-sync-at", type=at_least(0), default=None, metavar="N",
                   help="from measured step N on, the rollout stops loading the weights the "
                        f"trainer still sends ({nm.ALERT_WEIGHTS_STALE} once it is more than "
                        f"{MIXIN.weights_stale_versions} version behind; the demo's Prometheus "
                        f"holds it {STALE_FOR}, not {MIXIN.weights_stale_for})")


def weight_config(args) -> dict:
    """Config's weight-sync fields from the flags, checked."""
    at = {"--corrupt-weights-at": args.corrupt_weights_at,
          "--skip-weight-sync-at": args.skip_weight_sync_at}
    given = [flag for flag, n in at.items() if n is not None]
    if given and not args.weight_sync:
        raise SystemExit(f"dpobs demo: {' and '.join(given)} need --weight-sync")
    if any(at[flag] < 1 for flag in given):
        raise SystemExit("dpobs demo: the weight faults take a measured step, N >= 1")
    if args.weight_sync and args.async_k:
        raise SystemExit("dpobs demo: --weight-sync runs in lockstep; not with --async")
    if args.corrupt_weights_at is not None and not args.verify_tensor_hash:
        print("note: --corrupt-weights-at without --verify-tensor-hash: only the workload's "
              "own check will notice", file=sys.stderr)
    return {"weight_sync": args.weight_sync, "corrupt_weights_at": args.corrupt_weights_at,
            "skip_weight_sync_at": args.skip_weight_sync_at}


def stack_mixin(cfg):
    """The mixin Config of the demo's stack: None (the shipped files) without a weight sync."""
    return dataclasses.replace(MIXIN, weights_stale_for=STALE_FOR) if cfg.weight_sync else None


# -- numbers ------------------------------------------------------------------------------
def truth_of(*truths) -> dict | None:
    """One process's weight-sync truth over periods (warm-up, measured steps), or None."""
    parts = [t["weights"] for t in truths if "weights" in t]
    if not parts:
        return None
    out = {k: sum(p[k] for p in parts) for k in ("syncs", "seconds", "bytes", "tensors",
                                                  "compared")}
    out["differ"] = {}
    for p in parts:
        for reason, n in p["differ"].items():
            out["differ"][reason] = out["differ"].get(reason, 0) + n
    return out | {"side": parts[0]["side"], "version": parts[-1]["version"]}


def metrics_of(samples, side: str) -> dict:
    """One side's numbers from a process's scraped samples (readback's WeightTotals, and the
    tensor counter it leaves unread)."""
    w, tensors, step_s = WeightTotals(), 0.0, 0.0
    for name, labels, value in samples:
        if name == nm.WEIGHTS_TENSORS_SERIES and labels.get("side") == side:
            tensors += value
        elif name == f"{nm.STEP_DURATION_SERIES}_sum":
            step_s += value
        else:
            w.add(name, labels, value)
    s = w.sides.get(side, Side())
    return {"syncs": s.syncs, "seconds": s.seconds, "bytes": s.bytes, "tensors": tensors,
            "version": s.version or 0, "checked": w.checked or 0.0,
            "mismatched": {r: w.mismatched.get(r, 0.0) for r in nm.WEIGHT_MISMATCH_REASONS},
            "in_step": w.step_seconds or 0.0, "step_s": step_s}


def _mean(d: dict) -> float:
    return d["seconds"] / d["syncs"] if d["syncs"] else float("nan")


def _rate(d: dict) -> float:
    return d["bytes"] / d["seconds"] if d["seconds"] else float("nan")


def _row(name: str, side: str, source: str, d: dict) -> str:
    per = d["bytes"] / d["syncs"] / MB if d["syncs"] else float("nan")
    return (f"  {name:<12}{side:<9}{source:<9}{int(d['syncs']):>6}{_mean(d) * 1e3:>9.2f}"
            f"{per:>10.3f}{_rate(d) / MB:>9.1f}{int(d['tensors']):>9}{int(d['version']):>9}")


# -- the section --------------------------------------------------------------------------
def weight_lines(res, stack, cfg) -> list[str]:
    """The report's Weight sync section; nothing without --weight-sync."""
    if not cfg.weight_sync:
        return []
    sides = {k: truth_of(res.warm[k], res.truth[k]) for k in res.info}
    sides = dict(sorted(((k, t) for k, t in sides.items() if t is not None),
                        key=lambda kt: kt[1]["side"] != "send"))  # the sender first
    lines = [f"\nWeight sync over {cfg.weight_sync}, every step (version = the trainer's "
             "step; truth: the workload's clock around its own send and load loops, bytes as "
             "numel x element size)",
             f"  {'process':<12}{'side':<9}{'source':<9}{'syncs':>6}{'mean ms':>9}"
             f"{'MB/sync':>10}{'MB/s':>9}{'tensors':>9}{'version':>9}"]
    metrics = {k: metrics_of(res.scraped[k], t["side"]) for k, t in sides.items()}
    for k, t in sides.items():
        lines += [_row(f"{k[0]} {k[1]}", t["side"], "truth", t),
                  _row("", "", "metrics", metrics[k])]
    receivers = [k for k, t in sides.items() if t["side"] == "receive"]
    if receivers:
        slow = max(receivers, key=lambda k: _mean(metrics[k]))
        lines.append(f"  slowest receiver: {slow[0]} {slow[1]}, mean "
                     f"{_mean(metrics[slow]) * 1e3:.2f} ms (metrics) | "
                     f"{_mean(sides[slow]) * 1e3:.2f} ms (truth)")
    lines += _share_lines(res, sides, metrics) + _check_lines(sides, metrics, cfg)
    return lines + (_rule_lines(res, stack, sides) if stack is not None else [])


def _share_lines(res, sides, metrics) -> list[str]:
    out = []
    for k, t in sides.items():
        if t["side"] != "send":
            continue
        m, step_s = metrics[k], res.total(k)["step_s"]
        share_m = m["in_step"] / m["step_s"] if m["step_s"] else float("nan")
        out.append(f"  share of {k[0]} {k[1]}'s step: metrics {share_m:.1%} (its weight-sync "
                   f"seconds inside steps / its step seconds) | truth "
                   f"{t['seconds'] / step_s if step_s else float('nan'):.1%}")
    return out


def _check_lines(sides, metrics, cfg) -> list[str]:
    recv = [k for k, t in sides.items() if t["side"] == "receive"]
    compared = sum(sides[k]["compared"] for k in recv)
    differ: dict[str, int] = {}
    for k in recv:
        for reason, n in sides[k]["differ"].items():
            differ[reason] = differ.get(reason, 0) + n
    truth = (f"truth: {compared} compared with the rollout's replay of the trainer's updates, "
             f"{sum(differ.values())} differ" + (f" ({_reasons(differ)})" if differ else ""))
    if not cfg.verify:
        return [f"  tensors checked: guard off (--verify-tensor-hash checks them) | {truth}"]
    checked = sum(metrics[k]["checked"] for k in recv)
    bad = {r: sum(metrics[k]["mismatched"][r] for k in recv) for r in nm.WEIGHT_MISMATCH_REASONS}
    return [f"  tensors checked {int(checked)}, mismatched {int(sum(bad.values()))} "
            f"({_reasons(bad)}) | {truth}"]


def _reasons(counts: dict) -> str:
    return ", ".join(f"{r} {int(n)}" for r, n in counts.items())


def _rule_lines(res, stack, sides) -> list[str]:
    """The weight-sync recording rules beside the measured steps' truth (Prometheus rates
    from the post-warm-up scrape)."""
    measured = {k: truth_of(res.truth[k]) for k in sides}
    by_side = {s: [t for t in measured.values() if t and t["side"] == s] for s in nm.WEIGHT_SIDES}
    pooled = {s: {x: sum(t[x] for t in ts) for x in ("syncs", "seconds", "bytes")}
              for s, ts in by_side.items()}
    senders = [k for k, t in measured.items() if t and t["side"] == "send"]
    sync_s = sum(measured[k]["seconds"] for k in senders)
    step_s = sum(res.truth[k]["step_s"] for k in senders)

    def one(expr):
        r = stack.query(expr)
        return r[0]["value"] if r else float("nan")

    rows = [(f'{nm.JOB_SIDE_WEIGHTS_SYNC_MEAN}{{side="{s}"}} (ms)', 1e3 * one(
        f'{nm.JOB_SIDE_WEIGHTS_SYNC_MEAN}{{side="{s}"}}'), 1e3 * _mean(pooled[s]))
            for s in nm.WEIGHT_SIDES]
    rows += [(f'{nm.JOB_SIDE_WEIGHTS_BANDWIDTH}{{side="{s}"}} (MB/s)', one(
        f'{nm.JOB_SIDE_WEIGHTS_BANDWIDTH}{{side="{s}"}}') / MB, _rate(pooled[s]) / MB)
             for s in nm.WEIGHT_SIDES]
    rows += [(f"{nm.JOB_WEIGHTS_SYNC_MAX_MEAN} (ms)", 1e3 * one(nm.JOB_WEIGHTS_SYNC_MAX_MEAN),
              1e3 * max((_mean(t) for t in by_side["receive"]), default=float("nan"))),
             (nm.JOB_WEIGHT_SYNC_FRAC_OF_STEP, one(nm.JOB_WEIGHT_SYNC_FRAC_OF_STEP),
              sync_s / step_s if step_s else float("nan"))]
    return (["  weight-sync recording rules (5m windows) beside the measured steps' truth",
             f"  {'rule':<80}{'prometheus':>12}{'truth':>10}"]
            + [f"  {label:<80}{p:>12.3f}{t:>10.3f}" for label, p, t in rows])
