#!/usr/bin/env python3
"""`make compat`: the compatibility matrix of compat/cells.toml.

With the network, each cell's virtualenv is built from the dpobs-otel wheel (one wheel per
Python version, built here from the checkout, every run) beside the framework's pins, once
per lock (the interpreter, the pins, the wheel's requirements, pip's constraints; lock_key)
and kept in a cache outside the checkout (--cache, default /var/cache/dpobs-compat as root):
a later run with the same lock reinstalls only the wheel there. Then the cell's checks (the
test modules GROUPS declares version-dependent, and the demo's) run in a loopback-only
network namespace (unshare --net, only `lo` up). The next cell's virtualenv is built while
the current one runs, and done before its `alone` pass (tests that compare clocks) starts.
Then the TransferQueue releases that no cell runs, each swapped into the suite's own .venv,
and the dry-run resolutions beside each framework's pins.
Prints each step's time and a summary table; exits non-zero if anything failed.

    python compat/run.py [--only CELL,...] [--checks core+guard,transferqueue,ray,...,demo]
                         [--swap VERSION,...] [--swap-tests own-e2e] [--skip-swap]
                         [--skip-resolve] [--cache DIR | --no-cache]

--checks picks checks for every cell; an entry CELL=a/b picks that cell's own instead
(`--checks roll=transferqueue/demo,nemo-rl=ray`: roll its TransferQueue and demo checks,
nemo-rl its Ray check, every other cell everything).

--swap names the TransferQueue releases swapped into the suite's .venv (default cells.toml's
[swap], and none with --only); --swap-tests own-e2e runs only each release's own e2e tests
and the kv entry points there (SWAP_OWN_E2E), which is what CI runs for every release.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import email.parser
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("COMPAT_DIR", "/tmp/dpobs-compat"))


def default_cache() -> Path:
    """Where the cells' virtualenvs stay between runs: outside the checkout, which CI clones
    afresh each time (as root, /var/cache; else the user's cache directory)."""
    if os.environ.get("COMPAT_CACHE"):
        return Path(os.environ["COMPAT_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/dpobs-compat")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpobs-compat"


CACHE = default_cache()
# A cached virtualenv older than this is built again even if its lock is unchanged: the
# unpinned requirements (the newest cell's everything, `ray[default]`, what pins leave
# free) then move to their newest releases, as they did when every run built afresh.
CACHE_DAYS = float(os.environ.get("COMPAT_CACHE_DAYS", "7"))
STAMP = ".dpobs-compat-lock.json"  # written into a virtualenv last: its build completed
SUITE_PY = REPO / ".venv" / "bin" / "python"
LOOPBACK = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
# What each cell runs (inside the namespace, from the repository root): the test modules whose
# outcome can depend on the cell's versions (its Python, torch, tensordict, numpy, msgpack,
# the OpenTelemetry SDK and exporter, Ray, TransferQueue, Mooncake, verl), then the demo on
# TransferQueue with its truth columns checked (compat/demo_check.py). Declared here once;
# tests/test_compat_run.py fails when a test module that imports one of those libraries, or
# a dpobs_otel module that does, is neither here nor in NOT_VERSIONED with its reason.
ADAPTER = ["tests/adapters/transferqueue"]
GROUPS = {  # --checks' names
    # Sizing, row age, the guard's kernels and hooks (torch, tensordict, numpy, msgpack),
    # the OpenTelemetry SDK under the instruments (its cardinality limit and the series per
    # endpoint too), the expositions and the tracer, the
    # critical path's asyncio and thread shapes (Python), the stores; test_network proves
    # the cell's own run is loopback-only. (The protobuf runtime the exposition tests decode
    # with comes with Ray, which every cell has through TransferQueue.)
    "core+guard": ["tests/shims/test_otel_histogram.py", "tests/shims/test_otel_sdk.py",
                   "tests/shims/test_torch_jagged.py", "tests/shims/test_asyncio_tasks.py",
                   "tests/test_client.py", "tests/test_critical.py", "tests/test_rowage.py",
                   "tests/test_sizing.py", "tests/test_telemetry.py", "tests/test_imports.py",
                   "tests/test_network.py", "tests/testing/test_testing_imports.py",
                   "tests/test_instruments.py", "tests/test_faults.py",
                   "tests/test_facade.py", "tests/exporters/test_http.py",
                   "tests/exporters/test_protobuf.py", "tests/readback/test_native.py",
                   "tests/readback/test_cluster_quantiles.py", "tests/tracing/test_hooks.py",
                   "tests/test_labels.py", "tests/test_series_budget.py",
                   "tests/guard", "tests/cuda", "tests/stores"],
    # The TransferQueue adapter's live tests with the installed release's own e2e tests, and
    # the switch matrix and test_invisible (the program's results with dpobs on and off,
    # against a live TransferQueue; they skip where Mooncake is absent).
    "transferqueue": [*ADAPTER, "tests/test_switch_matrix.py", "tests/test_invisible.py"],
    # Ray's object store, its private names first.
    "ray": ["tests/shims/test_ray_private.py", "tests/adapters/ray"],
    # The weight transports (torch.distributed's gloo, Ray's board, Mooncake's engine, NIXL),
    # and the adapters of the libraries no cell pins today: each module skips itself where
    # its library is absent, so a cell that adds mooncake or verl to its pins runs them.
    "weights": ["tests/weights"],
    "mooncake+verl": ["tests/adapters/mooncake", "tests/adapters/verl"],
}
# A group runs only where its libraries are installed (distribution names, as SHOWN's).
NEEDS = {"ray": ["ray"]}
# Test modules that import a versioned library but whose outcome no cell's versions can
# change, and dpobs_otel modules that import one but only such tests run, each with why
# (make test runs them all, on the suite's own versions).
NOT_VERSIONED = {
    "a demo run, asserted on its reports, rules and alerts; the torch in it is the "
    "workload's payload, and each cell checks the demo's truth itself (compat/demo_check.py)":
        ["tests/demo", "tests/top", "tests/tracing/test_demo_trace.py", "tests/test_e2e.py",
         "tests/readback/test_cluster.py", "tests/readback/test_cluster_rowage.py",
         "dpobs_otel/testing/step_worker.py", "dpobs_otel/testing/cluster_workload.py"],
    "a Prometheus, an agent or a receiver reading what the exposition the core group checks "
    "per cell serves: the binaries' behaviour, not the libraries'":
        ["tests/agent", "tests/exporters/test_native_live.py", "tests/readback/test_scrape.py",
         "tests/doctor/test_doctor_live.py", "tests/report/test_report_ended.py"],
    "what a cell cannot import: OTLP's proto (the otlp extra, which no cell installs) and "
    "tomllib (Python 3.11, and the roll cell runs 3.10); a collection error would stop the "
    "cell's whole pass. The adapters' own modules check dpobs's start per cell":
        ["tests/tracing/test_otlp.py", "tests/adapters/test_instrumentation.py"],
    "the repository's own lists and drawings, and this runner's own tests (whose scan names "
    "dpobs_otel modules in its strings); tensors only as the payload of a Telemetry":
        ["tests/test_contract.py", "tests/report/test_report_png.py",
         "tests/test_compat_run.py"],
}
# A swapped release under CI: its own e2e tests through the adapter (every call counted, guard
# off and on) and every kv_* entry point measured, refusals included. Serially: about 50 s a
# release, and 0.1.6's parallel set-up errors (cells.toml) are not understood yet.
SWAP_OWN_E2E = ["tests/adapters/transferqueue/test_tq_own_e2e.py",
                "tests/adapters/transferqueue/test_transferqueue_calls.py"]
# A cell's pytest runs in parallel workers, a test module to a worker (its live cluster
# started once), as `make test` does (docs/development/testing.md): most of a cell's time is
# waiting on Ray, TransferQueue and scrapes, which the workers overlap on 2 cores. A worker
# that dies ends the run at once (Makefile says why). A cell may run some of its groups
# serially instead (`serial = [...]` in cells.toml, with its reason).
# Two cells' parallel and serial checks run at once (LANES; the swapped releases in the same
# lanes), three workers each: with four each, the load reached 12 and one driver did not
# start its Ray in 90 s. The whole matrix took 41.8 minutes that way, against 56.5 one cell
# at a time (compatibility.md). The checks that compare clocks (`alone`, and the demo's
# truth) wait for every lane and download to end, then run one at a time: QUIET.
WORKERS = int(os.environ.get("COMPAT_WORKERS", "3"))
LANES = int(os.environ.get("COMPAT_LANES", "2"))
QUIET = ("alone", "demo")
# Every pytest of the matrix: the 60 s limit is make test's to enforce (on this machine's own
# run of these tests); a cell prints its slowest tests and leaves the verdict to their outcomes.
PYTEST_OPTS = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--slow-limit=0"]
SHOWN = ["torch", "tensordict", "transferqueue", "ray", "numpy", "opentelemetry-sdk",
         "opentelemetry-exporter-prometheus"]


def parallel(workers: int) -> list[str]:
    return (["-n", str(workers), "--dist", "loadfile", "--max-worker-restart=0"]
            if workers > 1 else [])


def log(msg: str) -> None:
    print(f"[compat {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd, *, timeout=None, **kw) -> tuple[int, float, str]:
    """Run cmd; (exit status, seconds, last lines of its output)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, **kw)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"{exc.output or ''}\n(timed out after {timeout} s)"
    return rc, time.monotonic() - t0, out


def interpreter(version: str) -> str:
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python"))
    path = found[-1] if found else shutil.which(f"python{version}")
    if path is None:
        sys.exit(f"compat: no Python {version} on this machine")
    return path


def loopback_only() -> list[str]:
    if os.geteuid() == 0 and shutil.which("ip") and sh(["unshare", "--net", "true"])[0] == 0:
        return LOOPBACK
    if os.environ.get("CI"):
        sys.exit("compat: under CI the cells must run in a loopback-only namespace "
                 "(root, unshare and iproute2's ip)")
    log("NOT network-isolated (needs root, unshare and ip): running on the host network")
    return []


def wheel(python: str) -> Path:
    """The dpobs-otel wheel for this interpreter (the guard's C kernel is per version)."""
    out = WORK / "wheels" / Path(python).parent.parent.name
    found = list(out.glob("dpobs_otel-*.whl"))
    if not found:
        rc, _, text = sh([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                          str(REPO)])
        found = list(out.glob("dpobs_otel-*.whl"))
        if rc or not found:
            raise RuntimeError(f"building the wheel with {python} failed:\n{text[-3000:]}")
    return found[0]


def requirements(cell: dict, extras: str) -> tuple[list[str], list[str]]:
    """(requirements, pip options) of a cell's install."""
    if "floor" in cell:
        rc, _, text = sh([sys.executable, str(REPO / "compat" / "floor.py"), *cell["floor"]])
        if rc:
            raise RuntimeError(text)
        # Issue 29: the floors install together as wheels. antlr4-python3-runtime (hydra-core's,
        # for TransferQueue) exists only as an sdist: without it the resolver falls back to
        # hydra-core 0.11 and omegaconf 1.4, whose OmegaConf.create TransferQueue cannot call.
        return text.split(), ["--only-binary", ":all:", "--no-binary",
                              "antlr4-python3-runtime"]
    return list(cell.get("pins", [])), []


def lock_key(python: str, reqs: list[str], opts: list[str], wheel_requires: list[str],
             constraints: str) -> str:
    """A cell's lock: what its virtualenv's contents follow from (the interpreter's exact
    version, the pins and pip options, the wheel's declared requirements, pip's machine-wide
    constraints). The same lock reuses the virtualenv; anything else builds a new one."""
    blob = json.dumps({"python": python, "reqs": sorted(reqs), "opts": opts,
                       "wheel": sorted(wheel_requires), "constraints": constraints},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def python_version(python: str) -> str:
    rc, _, text = sh([python, "-c", "import platform, sys; print(platform.python_version(),"
                      " sys.implementation.cache_tag, platform.machine())"])
    if rc:
        raise RuntimeError(f"{python} does not start:\n{text[-2000:]}")
    return text.strip()


def wheel_requires(whl: Path) -> list[str]:
    """The wheel's Requires-Dist lines (its dependencies and every extra's)."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    # The headers only: the long description after them may hold anything.
    return email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist", [])


def pip_constraints() -> str:
    """The text of the constraint files pip applies on this machine (cells.toml's header)."""
    named = os.environ.get("PIP_CONSTRAINT", "").split() + ["/etc/xdg/pip/constraints.txt"]
    return "\n".join(Path(f).read_text() for f in named if Path(f).is_file())


def cached(cache: Path, name: str, key: str) -> tuple[Path, bool]:
    """The virtualenv of cell `name` under lock `key`, and whether it is complete and young
    enough to reuse. Any other of the cell's virtualenvs (an older lock, a build that never
    finished) is removed: one a cell, several GB each."""
    venv = cache / "venvs" / f"{name}-{key}"
    stamp = venv / STAMP
    try:
        made = json.loads(stamp.read_text())
        fresh = made["key"] == key and time.time() - made["built"] < CACHE_DAYS * 86400
    except (OSError, ValueError, KeyError):
        fresh = False
    for old in (cache / "venvs").glob(f"{glob.escape(name)}-{'[0-9a-f]' * len(key)}"):
        if old != venv or not fresh:  # the pattern: not cell `verl`'s for a cell `verl-0.9`
            shutil.rmtree(old, ignore_errors=True)
    return venv, fresh


def build(cell: dict, extras: str, cache: Path | None = None) -> dict:
    """The cell's virtualenv, with the network: reused from `cache` where its lock is
    unchanged, with only the dpobs-otel wheel installed afresh (it is what is under test);
    else built there (or, with no cache, under WORK, for the caller to delete). pip keeps its
    downloads in its own cache (~/.cache/pip), used as is. Returns what run() needs."""
    python = interpreter(cell["python"])
    t0 = time.monotonic()
    venv, reused = WORK / "venvs" / cell["name"], False
    try:
        whl = wheel(python)
        reqs, opts = requirements(cell, extras)
        if cache is None:
            shutil.rmtree(venv, ignore_errors=True)
        else:
            key = lock_key(python_version(python), reqs, opts, wheel_requires(whl),
                           pip_constraints())
            venv, reused = cached(cache, cell["name"], key)
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile"]
        if reused and sh([*pip, "--no-deps", "--force-reinstall", str(whl)])[0]:
            # A cached virtualenv that takes no wheel (a disk error, a hand's edit) would
            # fail every run after this one too: built again now.
            log(f"{cell['name']}: the cached virtualenv took no wheel; building it again")
            shutil.rmtree(venv, ignore_errors=True)
            reused = False
        if not reused:
            create(python, venv, [*pip, *opts, f"dpobs-otel[{extras}] @ {whl.as_uri()}", *reqs])
            if cache is not None:
                (venv / STAMP).write_text(json.dumps({"key": key, "built": time.time()}))
        versions = installed(venv / "bin" / "python")
        error = None
    except RuntimeError as exc:
        versions, error = {}, str(exc)
    return {"venv": venv, "versions": versions, "build_s": time.monotonic() - t0,
            "error": error, "reused": reused}


def create(python: str, venv: Path, install: list[str]) -> None:
    """A virtualenv at `venv` from `python`, then the `install` command run in it."""
    for cmd in ([python, "-m", "venv", str(venv)], install):
        rc, _, text = sh(cmd)
        if rc:
            raise RuntimeError(f"{' '.join(cmd)}\n{text[-4000:]}")


def installed(python) -> dict:
    code = ("import importlib.metadata as m, json, sys\n"
            f"names = {SHOWN!r}\n"
            "out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = '-'\n"
            "out['python'] = '.'.join(map(str, sys.version_info[:3]))\n"
            "print(json.dumps(out))")
    rc, _, text = sh([str(python), "-c", code], cwd="/")
    return json.loads(text.splitlines()[-1]) if rc == 0 else {}


def checks(python: str, only=None, serial=()) -> list[tuple[str, list[str]]]:
    """The cell's commands: one pytest over the selected groups of tests in WORKERS workers
    (one run, so its workers fill each other's waits and the run has one tail), one over the
    groups the cell runs `serial`ly, one over their `alone` tests, then the demo's check."""
    have = installed(python)
    groups = {g: tests for g, tests in GROUPS.items()
              if all(have.get(lib, "-") != "-" for lib in NEEDS.get(g, ()))}
    chosen = [g for g in groups if only is None or g in only]
    # The venv's pytest script, not `python -m pytest`: that would put the checkout first on
    # sys.path, and the tests must import dpobs_otel from the installed wheel.
    pytest = [str(Path(python).parent / "pytest"), *PYTEST_OPTS]
    out = []
    for picked, workers in (([g for g in chosen if g not in serial], WORKERS),
                           ([g for g in chosen if g in serial], 1)):
        if picked:
            paths = [t for g in picked for t in groups[g]]
            out.append((",".join(picked) + ("" if workers > 1 else " (serial)"),
                        [*pytest, *parallel(workers), "-m", "not alone", *paths]))
    if chosen:  # as make test runs them: the tests marked `alone` after the others
        out.append(("alone", [*pytest, "-m", "alone", *[t for g in chosen for t in groups[g]]]))
    if only is None or "demo" in only:
        out.append(("demo", [python, str(REPO / "compat" / "demo_check.py")]))
    return out


def checks_for(name: str, spec: str | None) -> list[str] | None:
    """What `--checks` picks for cell `name`: its own `NAME=a/b` entry where it has one, else
    the entries without a cell, else everything (None)."""
    if not spec:
        return None
    shared, own = [], None
    for item in spec.split(","):
        cell, named, picks = item.partition("=")
        if not named:
            shared.append(item)
        elif cell == name:
            own = picks.split("/")
    return own if own is not None else (shared or None)


def run_checks(name: str, python: str, ns: list[str], env: dict, only=None, serial=(),
               quiet: bool = False) -> list[dict]:
    """The cell's checks in turn: those that compare clocks (QUIET) if `quiet`, which the
    caller runs with nothing beside them, else the others."""
    results = []
    for what, cmd in checks(python, only, serial):
        if (what in QUIET) != quiet:
            continue
        rc, secs, out = sh([*ns, *cmd], cwd=REPO, env=env, timeout=1500)
        rc = 0 if rc == 5 and what == "alone" else rc  # none of the chosen tests is alone
        log(f"{name}: {what} {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {secs:.0f} s"
            f" - {last_line(out)[:150]}")
        if rc:
            print(out[-8000:], flush=True)
        results.append({"check": what, "rc": rc, "s": secs, "tests": failures(out) if rc else []})
    return results


def last_line(out: str) -> str:
    """pytest's summary: the last line of its output that is not blank."""
    return next((line for line in reversed(out.splitlines()) if line.strip()), "")


def failures(out: str, most: int = 8) -> list[str]:
    """pytest's short summary lines of what failed, for the summary: CI shows a log's tail,
    and a failed check's own output scrolls out of it behind the next cells'."""
    lines = [ln for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return [ln[:200] for ln in lines[:most]] + ([f"... and {len(lines) - most} more"]
                                                if len(lines) > most else [])


def outcome(results: list[dict]) -> dict:
    """A summary row's verdict from its checks: ok, the failed checks, their failed tests."""
    failed = [r["check"] for r in results if r["rc"]]
    return {"ok": not failed, "failed": failed,
            "tests": [t for r in results for t in r.get("tests", ())]}


def cell_env(extra_path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ of the cells in the checkout
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def resolve(r: dict) -> dict:
    """`pip install --dry-run` of the wheel (with its transferqueue extra) beside a
    framework's pins, with that framework's Python: a table row."""
    python = interpreter(r["python"])
    whl = wheel(python)
    cmd = [python, "-m", "pip", "install", "--dry-run", "-q", "--ignore-installed",
           f"dpobs-otel[transferqueue] @ {whl.as_uri()}", *r["pins"]]
    rc, secs, out = sh(cmd, timeout=1200)
    log(f"resolve beside {r['name']}: {'ok' if rc == 0 else 'FAILED'} in {secs:.0f} s")
    if rc:
        print(out[-4000:], flush=True)
    return {"name": f"resolve: {r['name']}", "versions": {"python": r["python"]},
            "build_s": secs, "run_s": 0.0, "ok": rc == 0,
            "failed": [] if rc == 0 else ["pip install --dry-run"]}


def swap_install(v: str):
    """TransferQueue `v` alone, into a folder put first on the suite's PYTHONPATH."""
    target = WORK / "swap" / f"transferqueue-{v}"
    shutil.rmtree(target, ignore_errors=True)
    rc, secs, out = sh([str(SUITE_PY), "-m", "pip", "install", "-q", "--no-deps",
                        "--target", str(target), f"transferqueue=={v}"])
    return v, target, rc, secs, out


def swap_check(installing, ns: list[str], tests: list[str]) -> dict:
    """A swapped TransferQueue release's tests in the suite's .venv: a summary row."""
    v, target, rc, secs, out = installing.result()
    t0 = time.monotonic()
    if rc:
        log(f"transferqueue {v}: install FAILED\n{out[-3000:]}")
        results = [{"check": "install", "rc": rc, "s": 0.0}]
    else:
        env = cell_env(os.pathsep.join([str(target), str(REPO)]))
        rc2, s2, out2 = sh([*ns, str(SUITE_PY), "-m", "pytest", *PYTEST_OPTS, *tests],
                           cwd=REPO, env=env, timeout=1500)
        log(f"transferqueue {v} (suite .venv): {'ok' if rc2 == 0 else 'FAILED'} in "
            f"{s2:.0f} s - {last_line(out2)[:150]}")
        if rc2:
            print(out2[-8000:], flush=True)
        results = [{"check": "transferqueue", "rc": rc2, "s": s2,
                    "tests": failures(out2) if rc2 else []}]
    shutil.rmtree(target, ignore_errors=True)
    vers = installed(SUITE_PY)
    vers.update(transferqueue=v)
    return {"name": f"tq-{v}", "versions": vers, "build_s": secs,
            "run_s": time.monotonic() - t0, **outcome(results)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None, help="comma-separated cell names")
    ap.add_argument("--checks", default=None, help="comma-separated: "
                    f"{', '.join(GROUPS)}, demo (default all); CELL=a/b picks a cell's own")
    ap.add_argument("--swap", default=None, help="comma-separated TransferQueue releases "
                    "to swap into the suite's .venv (default cells.toml's [swap])")
    ap.add_argument("--swap-tests", choices=["adapter", "own-e2e"], default="adapter")
    ap.add_argument("--skip-swap", action="store_true")
    ap.add_argument("--skip-resolve", action="store_true")
    ap.add_argument("--cache", default=str(CACHE), help="where the cells' virtualenvs stay "
                    "between runs, one a cell, reused while its lock is unchanged (default "
                    "%(default)s; COMPAT_CACHE)")
    ap.add_argument("--no-cache", action="store_true", help="build each cell's virtualenv "
                    "afresh under COMPAT_DIR and delete it after its checks")
    args = ap.parse_args()
    cache = None if args.no_cache else Path(args.cache)
    spec = tomllib.loads((REPO / "compat" / "cells.toml").read_text())
    cells = [c for c in spec["cell"] if args.only is None or c["name"] in args.only.split(",")]
    for cell in cells:  # a misspelt group would otherwise run in the workers, unsaid
        unknown = set(cell.get("serial", ())) - set(GROUPS)
        if unknown:
            ap.error(f"cells.toml: cell {cell['name']}: serial names no check {sorted(unknown)}")
    extras = spec["extras"]
    ns = loopback_only()
    WORK.mkdir(parents=True, exist_ok=True)
    if cache is not None:  # a second run on this machine waits: it would reinstall the
        (cache / "venvs").mkdir(parents=True, exist_ok=True)  # wheel under this one's tests
        lock = open(cache / "lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
    t_all = time.monotonic()
    rows = []

    # One wheel per Python version, built before anything runs beside anything (in-tree),
    # afresh: from this checkout.
    shutil.rmtree(WORK / "wheels", ignore_errors=True)
    for version in sorted({c["python"] for c in cells} | {r["python"] for r in spec["resolve"]}):
        t0 = time.monotonic()
        log(f"wheel for Python {version}: {wheel(interpreter(version)).name} "
            f"({time.monotonic() - t0:.0f} s)")
    # Resolutions and swapped TransferQueue releases need the network: on a thread of their
    # own beside the cells (downloads, while the cells use the CPUs).
    net = concurrent.futures.ThreadPoolExecutor(1)
    resolves = [] if args.skip_resolve else [net.submit(resolve, r) for r in spec["resolve"]]
    versions = (args.swap.split(",") if args.swap
                else [] if args.only else spec["swap"]["transferqueue"])
    swaps = [] if args.skip_swap else [net.submit(swap_install, v) for v in versions]
    swap_tests = SWAP_OWN_E2E if args.swap_tests == "own-e2e" else ADAPTER

    ran = {}  # cell name -> (its build, its checks' results)

    def busy(cell: dict, pending) -> None:
        """A lane's turn at one cell: its virtualenv (built in order, one at a time, beside
        the lanes), then its checks that do not compare clocks."""
        built, name = pending.result(), cell["name"]
        how = "reused (its lock unchanged), the wheel reinstalled" if built["reused"] \
            else "built"
        log(f"{name}: virtualenv {how} in {built['build_s']:.0f} s "
            f"{json.dumps(built['versions'])}")
        if built["error"]:
            log(f"{name}: BUILD FAILED\n{built['error']}")
            results = [{"check": "build", "rc": 1, "s": 0.0}]
        else:
            results = run_checks(name, str(built["venv"] / "bin" / "python"), ns,
                                 cell_env(), checks_for(name, args.checks),
                                 cell.get("serial", ()))
        ran[name] = (built, results)

    t_cells = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as builder, \
            concurrent.futures.ThreadPoolExecutor(LANES) as lanes:
        builds = [builder.submit(build, cell, extras, cache) for cell in cells]
        turns = [lanes.submit(busy, cell, b) for cell, b in zip(cells, builds)]
        swapped = [lanes.submit(swap_check, f, ns, swap_tests) for f in swaps]
        for turn in turns:
            turn.result()
        swap_rows = [f.result() for f in swapped]
    concurrent.futures.wait(resolves)  # pip's downloads: nothing beside the quiet checks
    for cell in cells:
        built, results = ran[cell["name"]]
        if not built["error"]:
            results += run_checks(cell["name"], str(built["venv"] / "bin" / "python"), ns,
                                  cell_env(), checks_for(cell["name"], args.checks),
                                  cell.get("serial", ()), quiet=True)
        if cache is None:  # several GB each (a PyPI torch is a CUDA build)
            shutil.rmtree(built["venv"], ignore_errors=True)
        rows.append({"name": cell["name"], "versions": built["versions"] or
                     {"python": cell["python"]}, "build_s": built["build_s"],
                     "run_s": sum(r["s"] for r in results), **outcome(results)})
    rows += swap_rows
    log(f"cells and swaps in {(time.monotonic() - t_cells) / 60:.1f} min, {LANES} at a time")

    rows += [future.result() for future in resolves]
    net.shutdown()
    total = time.monotonic() - t_all
    print(table(rows, total), flush=True)
    return 0 if rows and all(r["ok"] for r in rows) else 1


def table(rows: list[dict], total: float) -> str:
    cols = ["python", *SHOWN[:5], "opentelemetry-sdk"]
    head = ["cell", *[c.replace("opentelemetry-", "otel-") for c in cols], "build s", "run s",
            "result"]
    body = [[r["name"], *[r["versions"].get(c, "") for c in cols], f"{r['build_s']:.0f}",
             f"{r['run_s']:.0f}", "pass" if r["ok"] else "FAIL: " + ", ".join(r["failed"])]
            for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["", "make compat: summary", "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in body]
    lines += [f"{r['name']}: {t}" for r in rows for t in r.get("tests", ())]
    failed = sum(not r["ok"] for r in rows)
    lines.append(f"{len(rows) - failed} of {len(rows)} passed; matrix time {total / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
