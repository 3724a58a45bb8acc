"""The device check (issue 46): what the guard, sizing and the weight proof cost on a CUDA
device, and how often they make the host wait, in one run of at most 5 minutes on one H200.

Sections (each figure a ratio of arms measured side by side, interleaved round by round, in
this run; each written to OUT/figures.jsonl as soon as it is measured):

    tests    pytest tests/cuda (digests and fingerprints equal the CPU's, the sync counts)
    syncs    host syncs per guarded put, get, weight sync and sizing call, counted by
             torch.cuda.set_sync_debug_mode("warn"); required 0, 1, 1 and 0
    weights  fingerprinting a bf16 model of 2 GB and of 8 GB (pending, then one settle)
             against one device copy_ of the same tensors; required <= 1.0x, goal 0.5x
    guard    the guard on a 1 GB put+get (digests at put, check at get) against two
             torch.hash_tensor XOR folds of the same batch; required <= 1.5x
    sizing   sizing's cost per op of a 256-row jagged batch on the device against the same
             batch on the CPU (both read metadata only)

    python benchmarks/gpu_check.py --check                  what is missing, nothing run
    python benchmarks/gpu_check.py --out DIR [--only SECTION ...]
    python benchmarks/gpu_check.py --rehearse --out DIR     every section on the CPU at a
                                                            1/1000 size: the script's own
                                                            test, never a figure

The device has Python 3.12 and torch 2.11 but neither dpobs nor OpenTelemetry nor tensordict:
benchmarks/gpu_wheels.sh builds the wheels it carries (.whl/), and `--install .whl` puts
them in /tmp/site offline (pip --no-index) before anything else is imported.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("tests", "syncs", "weights", "guard", "sizing")
NEEDED = {  # import name -> the wheel that brings it
    "torch": "torch (the device's own)", "dpobs_otel": "dpobs-otel (gpu_wheels.sh)",
    "opentelemetry.sdk.metrics": "opentelemetry-sdk",
    "opentelemetry.exporter.prometheus": "opentelemetry-exporter-prometheus",
    "prometheus_client": "prometheus-client", "tensordict": "tensordict",
    "msgpack": "msgpack", "yaml": "PyYAML", "pytest": "pytest"}
REQUIRED = {"weights": 1.0, "guard": 1.5}
SITE = "/tmp/site"


class Out:
    """Figures as JSON lines, flushed one by one (a run cut short keeps what it measured)."""

    def __init__(self, folder: Path, rehearsal: bool):
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.rehearsal = folder / "figures.jsonl", rehearsal

    def write(self, section: str, **fields) -> None:
        row = {"section": section, "rehearsal": self.rehearsal, **fields}
        line = json.dumps(row, default=str)
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


# ----------------------------------------------------------------------------- set-up


def install(wheels: Path, argv: list[str]) -> None:
    """The carried wheels into SITE, offline, then this script again with SITE first on
    PYTHONPATH (for it and the pytest it starts), without --install."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        sys.exit(f"no wheels in {wheels}: run benchmarks/gpu_wheels.sh here first")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", SITE, *files],
                   check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SITE, os.environ.get("PYTHONPATH", "")]))
    i = argv.index("--install")
    rest = argv[:i] + argv[i + 2:]
    os.execve(sys.executable, [sys.executable, __file__, *rest], env)


def check(out: Out | None) -> dict:
    """What is there: each import, torch's CUDA and hash_tensor, dpobs's C kernel."""
    found, missing = {}, []
    for name, wheel in NEEDED.items():
        try:
            mod = importlib.import_module(name)
            found[name] = getattr(mod, "__version__", None) or getattr(mod, "__file__", "?")
        except Exception as exc:  # any failure to import is a missing piece
            missing.append(f"{name} ({wheel}): {type(exc).__name__}: {exc}")
    report = {"python": sys.version.split()[0], "found": found, "missing": missing}
    if "torch" in found:
        import torch
        report["cuda"] = torch.cuda.is_available()
        report["device"] = torch.cuda.get_device_name(0) if report["cuda"] else None
        report["torch_cuda"] = torch.version.cuda
        report["hash_tensor"] = hasattr(torch, "hash_tensor")
    if "dpobs_otel" in found:
        from dpobs_otel.guard import kernel
        import dpobs_otel
        report["dpobs_from"] = dpobs_otel.__file__
        report["c_kernel"] = kernel.LIB is not None
        try:
            report["triton"] = importlib.import_module("triton").__version__
        except Exception as exc:
            report["triton"] = f"absent ({type(exc).__name__}): the torch kernels on CUDA"
    if not report.get("cuda"):
        report["needs_cuda"] = list(SECTIONS)
        report["note"] = "no CUDA device: every section needs one (--rehearse runs them on the CPU)"
    if out is not None:
        out.write("check", **report)
    return report


# ----------------------------------------------------------------------------- timing


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved(arms: dict, device, rounds: int) -> dict:
    """Median seconds of each arm, the arms run in turn each round (their order reversed
    every other round), after one warm-up round."""
    times = {k: [] for k in arms}
    names = list(arms)
    for r in range(rounds + 1):
        for name in (names if r % 2 else names[::-1]):
            _sync(device)
            t0 = time.perf_counter()
            arms[name]()
            _sync(device)
            if r:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def ratio_rows(out: Out, section: str, measured: dict, **extra) -> None:
    """One row for each arm but the last: its median over the last's."""
    *arms, base = list(measured)
    required = REQUIRED.get(section)
    for mine in arms:
        ratio = measured[mine] / measured[base]
        out.write(section, arm=mine, against=base, ratio=round(ratio, 3),
                  seconds={k: round(measured[k], 6) for k in (mine, base)}, required=required,
                  ok=None if required is None else ratio <= required, **extra)


# ----------------------------------------------------------------------------- sections


def section_tests(out: Out, args) -> None:
    # -P: the carried wheel's dpobs, not the checkout's (which has no cp312 C kernel)
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cuda"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    tail = (run.stdout + run.stderr).strip().splitlines()[-15:]
    out.write("tests", rc=run.returncode, summary=tail[-1] if tail else "", tail=tail)


def _model(gb: float, device):
    """A bf16 decoder's worth of tensors totalling about `gb` GB: square 4096 matrices, one
    embedding-sized one, and norms."""
    import torch
    side = 4096 if gb >= 1 else 64
    n = max(1, int(gb * 2**30 // (side * side * 2)))
    model = {f"layers.{i}.w": torch.randn(side, side, device=device).to(torch.bfloat16)
             for i in range(n - 1)}
    model["embed"] = torch.randn(side * 2 + 3, side // 2, device=device).to(torch.bfloat16)
    model.update({f"layers.{i}.norm": torch.ones(side, device=device, dtype=torch.bfloat16)
                  for i in range(n)})
    return model


def section_weights(out: Out, args, device) -> None:
    import torch
    from dpobs_otel.weights import fingerprint as wfp
    for gb in args.model_gb:
        model = _model(gb * args.scale, device)
        dst = {k: torch.empty_like(t) for k, t in model.items()}
        def proof():
            return wfp.settle({k: wfp.pending(k, t) for k, t in model.items()})

        arms = {"fingerprint": proof, "fingerprint, torch kernels": _torch_kernels(proof),
                "copy_": lambda: [dst[k].copy_(t) for k, t in model.items()]}
        size = sum(t.nbytes for t in model.values())
        ratio_rows(out, "weights", interleaved(arms, device, args.rounds), model_bytes=size,
                   tensors=len(model), goal=0.5)
        del model, dst
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _torch_kernels(fn):
    """fn with the guard's Triton kernel off (DPOBS_GUARD_TRITON=0): the torch kernels."""
    def run():
        os.environ["DPOBS_GUARD_TRITON"] = "0"
        try:
            return fn()
        finally:
            os.environ.pop("DPOBS_GUARD_TRITON", None)
    return run


def _batch(rows: int, nbytes: int, device):
    """A GRPO-shaped batch of about nbytes: half in bf16 dense observations, half in jagged
    rows of int64 tokens and their bf16 log-probs (odd lengths: rows end mid-word), the
    lengths spread over 0.5x to 1.5x their mean."""
    import torch
    from tensordict import TensorDict
    g = torch.Generator().manual_seed(0)
    mean = max(2, nbytes // (20 * rows))  # 10 bytes a token, half the batch
    lengths = torch.randint(mean // 2, mean + mean // 2, (rows,), generator=g) | 1
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    offsets = offsets.to(device)

    def jag(values):
        return torch.nested.nested_tensor_from_jagged(values, offsets)
    return TensorDict({
        "obs": torch.randn(rows, max(1, nbytes // (4 * rows)), device=device).to(torch.bfloat16),
        "tokens": jag(torch.randint(0, 50000, (total,), device=device)),
        "logp": jag(torch.randn(total, device=device).to(torch.bfloat16)),
    }, batch_size=[rows])


def _fold(td):
    import torch
    from dpobs_otel.shims import torch_jagged
    return [torch.hash_tensor(torch_jagged.values(v) if v.is_nested else v)
            for v in td.values()]


def _guard(device):
    import dpobs_otel as dpobs
    tel = dpobs.start(role="gpu-check", rank=0, port=0, verify_tensor_hash=True)
    return tel, tel.guard


def section_guard(out: Out, args, device) -> None:
    import torch
    if not hasattr(torch, "hash_tensor"):
        out.write("guard", skipped=f"torch {torch.__version__} has no torch.hash_tensor "
                  "(2.11 has it): no baseline to measure against")
        return
    rows = 4096
    batch = _batch(rows, int(2**30 * args.scale), device)
    ids = [f"sample-{i}" for i in range(rows)]
    tel, guard = _guard(device)
    try:
        def put_get():
            guard.after_get(ids, "p", guard.before_put(ids, "p", batch), None)
        arms = {"guard put+get": put_get, "guard, torch kernels": _torch_kernels(put_get),
                "2 hash_tensor folds": lambda: (_fold(batch), _fold(batch))}
        measured = interleaved(arms, device, args.rounds)
        totals = guard.totals()
        size = sum(v.values().nbytes if v.is_nested else v.nbytes for v in batch.values())
        ratio_rows(out, "guard", measured, batch_bytes=size, rows=rows,
                   failures=totals.get("failures", {}),
                   checked=sum(totals.get("checked", {}).values()),
                   mismatched=sum(totals.get("mismatched", {}).values()))
    finally:
        tel.shutdown()


def section_syncs(out: Out, args, device) -> None:
    from dpobs_otel import sizing
    from dpobs_otel.guard import kernel
    from dpobs_otel.weights import fingerprint as wfp
    if device.type != "cuda":
        out.write("syncs", skipped="needs CUDA: torch.cuda.set_sync_debug_mode counts device "
                  "syncs only (on the CPU tests/guard/test_host_syncs.py counts them)")
        return
    batch, ids = _batch(256, 1 << 20, device), [f"s{i}" for i in range(256)]
    model = _model(0.01, device)
    tel, guard = _guard(device)
    try:
        written, put = kernel.host_syncs(guard.before_put, ids, "p", batch)
        _, get = kernel.host_syncs(guard.after_get, ids, "p", written, None)
        kept, pend = kernel.host_syncs(lambda: {k: wfp.pending(k, t) for k, t in model.items()})
        _, settle = kernel.host_syncs(wfp.settle, kept)
        _, size = kernel.host_syncs(sizing.payload_nbytes, batch)
        got = {"put": put, "get": get, "weights_pending": pend, "weights_settle": settle,
               "sizing": size}
        want = {"put": 0, "get": 1, "weights_pending": 0, "weights_settle": 1, "sizing": 0}
        out.write("syncs", counts=got, required=want, ok=got == want,
                  failures=guard.totals().get("failures", {}))
    finally:
        tel.shutdown()


def section_sizing(out: Out, args, device) -> None:
    import torch
    from dpobs_otel import sizing
    on_device = _batch(256, 1 << 20, device)
    on_cpu = _batch(256, 1 << 20, torch.device("cpu"))
    reps = 200

    def per_op(td):
        return lambda: [sizing.payload_nbytes(td) for _ in range(reps)]
    arms = {"sizing on the device": per_op(on_device), "sizing on the cpu": per_op(on_cpu)}
    measured = interleaved(arms, device, args.rounds)
    ratio_rows(out, "sizing", measured, rows=256,
               us_per_op={k: round(v / reps * 1e6, 2) for k, v in measured.items()})


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="say what is missing; run nothing")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="these sections alone")
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    p.add_argument("--install", type=Path, help="carried wheels to install offline first")
    p.add_argument("--rehearse", action="store_true",
                   help="every section on the CPU at 1/1000 size (not a figure)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--model-gb", type=float, nargs="+", default=[2.0, 8.0])
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.rehearse:  # Triton's interpreter runs its kernel on the CPU (chosen at import)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.install:
        install(args.install, argv)  # does not return
    out = Out(args.out, args.rehearse)
    report = check(out)
    if report["missing"] or args.check:
        for line in report["missing"]:
            print("missing:", line, file=sys.stderr)
        if report["missing"] and not args.install:
            print("(carried wheels: --install .whl; benchmarks/gpu_wheels.sh builds them)",
                  file=sys.stderr)
        return 1 if report["missing"] else 0
    import torch
    if not report["cuda"] and not args.rehearse:
        print("no CUDA device: nothing to measure (--rehearse runs the sections on the CPU)",
              file=sys.stderr)
        return 2
    device = torch.device("cuda" if report["cuda"] else "cpu")
    args.scale = 1e-3 if args.rehearse else 1.0
    if args.rehearse and device.type == "cpu":  # the accelerators' code path, on the CPU
        from dpobs_otel.guard import sums
        sums.one_chunk = lambda where: True
    for name in args.only or SECTIONS:
        t0 = time.perf_counter()
        try:
            if name == "tests":
                section_tests(out, args)
            else:
                globals()[f"section_{name}"](out, args, device)
        except Exception as exc:  # one broken section must not cost the others' figures
            out.write(name, error=f"{type(exc).__name__}: {exc}")
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    from dpobs_otel.guard import kernel
    out.write("kernels", triton_failures=[repr(e) for e in kernel.triton_broken])
    return 0


if __name__ == "__main__":
    sys.exit(main())
