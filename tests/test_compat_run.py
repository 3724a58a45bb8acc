"""compat/run.py's choice of checks per cell (`--checks`), which .ci/run relies on to run
each cell of the matrix it can afford, and the selection of test modules a cell runs
(GROUPS, NOT_VERSIONED): read from the script itself, not a copy."""
from __future__ import annotations

import ast
import concurrent.futures
import importlib.util
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "compat" / "run.py"
# The libraries whose versions the cells vary (top-level import names).
VERSIONED = {"torch", "tensordict", "numpy", "opentelemetry", "ray", "transfer_queue",
             "mooncake", "verl", "msgpack"}


@pytest.fixture(scope="module")
def run():
    spec = importlib.util.spec_from_file_location("compat_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spec, cell, want", [
    (None, "roll", None),
    ("", "roll", None),
    ("transferqueue,demo", "roll", ["transferqueue", "demo"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "roll", ["transferqueue", "demo"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "nemo-rl", ["ray"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "newest", None),
    ("core+guard,nemo-rl=ray", "newest", ["core+guard"]),
    ("core+guard,nemo-rl=ray", "nemo-rl", ["ray"]),
])
def test_checks_for_picks_a_cell_s_own_entry_first(run, spec, cell, want):
    assert run.checks_for(cell, spec) == want


def test_the_quiet_checks_wait_for_every_lane_and_download_and_run_alone(
        run, monkeypatch, tmp_path):
    """Cells run their parallel checks LANES at a time; the checks that compare clocks
    (`alone`, the demo's truth) start only once every lane and every download has ended,
    each with nothing else running, and every cell still gets a row."""
    lock, running, seen = threading.Lock(), set(), []

    def busy_for(what, secs):
        with lock:
            seen.append((what, frozenset(running)))
            running.add(what)
        time.sleep(secs)
        with lock:
            running.discard(what)

    def sh(cmd, **kw):
        busy_for(cmd[-1], 0.1)
        return 0, 0.1, "1 passed"

    def resolve(r):
        busy_for(f"resolve {r['name']}", 0.3)
        return {"name": r["name"], "versions": {}, "build_s": 0.3, "run_s": 0.0, "ok": True,
                "failed": []}

    monkeypatch.setattr(run, "sh", sh)
    monkeypatch.setattr(run, "resolve", resolve)
    monkeypatch.setattr(run, "checks", lambda python, only=None, serial=(): [
        (what, [f"{python.split('/')[2]} {what}"]) for what in ("main", "alone", "demo")])
    monkeypatch.setattr(run, "build", lambda cell, extras, cache=None: {
        "venv": Path("/v") / cell["name"], "versions": {}, "build_s": 0.0, "error": None,
        "reused": True})
    monkeypatch.setattr(run, "wheel", lambda python: Path("dpobs_otel-0-py3-none-any.whl"))
    monkeypatch.setattr(run, "loopback_only", lambda: [])
    monkeypatch.setattr(run, "WORK", tmp_path)
    monkeypatch.setattr(run, "LANES", 2)
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "roll,floor,newest", "--skip-swap",
                                      "--cache", str(tmp_path / "cache")])
    assert run.main() == 0
    order = [what for what, _ in seen]
    quiet = [i for i, what in enumerate(order) if what.endswith(("alone", "demo"))]
    assert len(quiet) == 6 and min(quiet) > max(i for i, w in enumerate(order)
                                                 if w.endswith("main") or "resolve" in w)
    assert all(not beside for what, beside in seen if what.endswith(("alone", "demo")))
    assert any(any(b.endswith("main") for b in beside) for what, beside in seen
               if what.endswith("main"))  # two lanes


@pytest.mark.parametrize("serial, want", [
    ((), [("core+guard,transferqueue,ray,weights,mooncake+verl", True), ("alone", False),
          ("demo", False)]),
    (("transferqueue",), [("core+guard,ray,weights,mooncake+verl", True),
                          ("transferqueue (serial)", False), ("alone", False), ("demo", False)]),
])
def test_a_cell_runs_its_serial_groups_in_a_pytest_of_their_own(run, monkeypatch, serial,
                                                                 want):
    """cells.toml's `serial`: those groups' tests in one process, every other group's in
    the workers, and every group's `alone` tests after both."""
    monkeypatch.setattr(run, "installed", lambda python: {"ray": "2.49.2"})
    monkeypatch.setattr(run, "WORKERS", 4)
    got = run.checks("/venv/bin/python", serial=serial)
    assert [(what, "-n" in cmd) for what, cmd in got] == want
    tests = {what: [a for a in cmd if a.startswith("tests/")] for what, cmd in got}
    serial_paths = [t for what, paths in tests.items() if "serial" in what for t in paths]
    assert serial_paths == ([] if not serial else run.GROUPS["transferqueue"])
    assert set(tests["alone"]) == {t for paths in run.GROUPS.values() for t in paths}


def test_a_group_whose_library_is_absent_is_left_out(run, monkeypatch):
    """installed() names every library it looks for, an absent one as '-'."""
    monkeypatch.setattr(run, "installed", lambda python: {"ray": "-", "torch": "2.9.0"})
    got = run.checks("/venv/bin/python")
    assert got[0][0] == "core+guard,transferqueue,weights,mooncake+verl"
    assert not any(t in cmd for _, cmd in got for t in run.GROUPS["ray"])


def test_the_summary_names_each_failed_test_under_its_cell(run, monkeypatch):
    """CI shows the end of a log: the summary table must name what failed, since a failed
    check's own output scrolls out of that end behind the next cells'."""
    outs = {"parallel": (1, "....F.E\nFAILED tests/a.py::t - AssertionError: x\n"
                            "ERROR tests/b.py::u - OSError\n1 failed, 1 error"),
            "alone": (0, "FAILED looks like a summary line but the check passed\n1 passed")}
    monkeypatch.setattr(run, "sh", lambda cmd, **kw: (outs[cmd[-1]][0], 0.0, outs[cmd[-1]][1]))
    monkeypatch.setattr(run, "checks", lambda *a: [("core+guard", ["parallel"]),
                                                   ("alone", ["alone"])])
    results = run.run_checks("roll", "python", [], {})
    row = {"name": "roll", "versions": {}, "build_s": 1, "run_s": 2, "ok": False,
           "failed": ["core+guard"], "tests": [t for r in results for t in r["tests"]]}
    lines = run.table([row], 60).splitlines()
    assert lines[-3:] == ["roll: FAILED tests/a.py::t - AssertionError: x",
                          "roll: ERROR tests/b.py::u - OSError",
                          "0 of 1 passed; matrix time 1.0 min"]


def test_a_long_list_of_failures_is_cut_with_its_count(run):
    out = "\n".join(f"ERROR tests/m.py::t{i} - RuntimeError" for i in range(20))
    got = run.failures(out)
    assert got[:8] == [f"ERROR tests/m.py::t{i} - RuntimeError" for i in range(8)]
    assert got[8:] == ["... and 12 more"]


def test_a_row_s_verdict_names_its_failed_checks_and_their_tests(run):
    got = run.outcome([{"check": "build", "rc": 1, "s": 0.0},
                       {"check": "alone", "rc": 0, "s": 1.0, "tests": []},
                       {"check": "demo", "rc": 2, "s": 1.0, "tests": ["FAILED t"]}])
    assert got == {"ok": False, "failed": ["build", "demo"], "tests": ["FAILED t"]}
    assert run.outcome([{"check": "alone", "rc": 0, "s": 1.0}])["ok"]


def imported(path: Path, module: str = "") -> set[str]:
    """Every module name `path` imports, anywhere in it (in functions too): `import a.b`,
    `from a import b` (as a and a.b), relative imports resolved against `module`,
    `pytest.importorskip("a")`, the names an `instrumentation.lazy_names` table loads on
    first use, and string constants naming a dpobs_otel module (started with `python -m`)."""
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[:len(package) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name == "importorskip" and node.args and isinstance(node.args[0], ast.Constant):
                out.add(node.args[0].value)
            if name == "lazy_names" and len(node.args) == 2 and isinstance(node.args[1],
                                                                            ast.Dict):
                out |= {f"{module}.{v.value}" for v in node.args[1].values
                        if isinstance(v, ast.Constant)}
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith("dpobs_otel.")):
            out.add(node.value)
    return out


def package_imports() -> dict[str, tuple[Path, set[str]]]:
    """dpobs_otel's modules: name -> (file, what it imports)."""
    out = {}
    for path in sorted((ROOT / "dpobs_otel").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (path, imported(path, name))
    return out


def under(path: Path, listed) -> bool:
    return any(path == ROOT / x or ROOT / x in path.parents for x in listed)


def test_every_module_that_imports_a_versioned_library_is_in_a_cell_or_says_why_not(run):
    """A test module that imports torch, tensordict, numpy, the OpenTelemetry SDK, Ray,
    TransferQueue, Mooncake, verl or msgpack (itself, or through a dpobs_otel module that
    imports one) is run by each cell (GROUPS) or listed in NOT_VERSIONED with its reason;
    and every dpobs_otel module that imports one is reached from a cell's test modules, the
    conftest.py files beside them or the demo's check (through dpobs_otel's own imports), or
    is listed in NOT_VERSIONED. A new module the selection does not name fails here."""
    selected = [x for paths in run.GROUPS.values() for x in paths]
    exempt = [x for paths in run.NOT_VERSIONED.values() for x in paths]
    for path in selected + exempt:
        assert (ROOT / path).exists(), f"compat/run.py names {path}, which does not exist"
    pkg = package_imports()
    direct = {name for name, (_, names) in pkg.items()
              if {n.split(".")[0] for n in names} & VERSIONED}
    unlisted, roots = [], set(imported(ROOT / "compat" / "demo_check.py"))
    for path in sorted((ROOT / "tests").rglob("*.py")):
        names = imported(path)
        if under(path, selected) and not under(path, exempt):
            roots |= names
        elif (path.name.startswith("test_") and not under(path, exempt)
              and ({n.split(".")[0] for n in names} & VERSIONED or names & direct)):
            unlisted.append(str(path.relative_to(ROOT)))
    assert unlisted == [], f"test modules that import a versioned library, in no cell's " \
        f"selection (compat/run.py GROUPS) and not in NOT_VERSIONED: {unlisted}"
    reached, todo = set(), [n for n in roots if n in pkg]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [n for n in pkg[name][1] if n in pkg]
    missed = sorted(name for name in direct - reached if not under(pkg[name][0], exempt))
    assert missed == [], "dpobs_otel modules that import a versioned library, exercised " \
        "by no cell's test modules and not in NOT_VERSIONED"
    # And NOT_VERSIONED says nothing needless: a dpobs_otel file it names is reached by no
    # cell, a test file it names imports a versioned library.
    named = {name for name, (path, _) in pkg.items() if str(path.relative_to(ROOT)) in exempt}
    assert sorted(named & reached) == []
    needless = [x for x in exempt if x.startswith("tests/") and (ROOT / x).is_file()
                and not ({n.split(".")[0] for n in imported(ROOT / x)} & VERSIONED
                         or imported(ROOT / x) & direct)]
    assert needless == []


def test_no_module_is_both_run_and_exempt(run):
    """A path in both lists (or under a folder of the other) would say two things."""
    selected = [x for paths in run.GROUPS.values() for x in paths]
    exempt = [x for paths in run.NOT_VERSIONED.values() for x in paths]
    assert len(set(selected)) == len(selected) and len(set(exempt)) == len(exempt)
    both = [x for x in selected if under(ROOT / x, exempt)] + \
           [x for x in exempt if under(ROOT / x, selected)]
    assert both == []


def test_the_scan_sees_each_way_a_module_imports(tmp_path):
    """The scan the coverage test relies on: a miss here would let a module through."""
    src = tmp_path / "mod.py"
    src.write_text("import torch.nn\nfrom tensordict import TensorDict\n"
                   "from . import sibling\nfrom ..up import thing\n"
                   "def f():\n    import msgpack\n    pytest.importorskip('verl')\n"
                   "W = 'dpobs_otel.testing.step_worker'\n"
                   "__getattr__ = lazy_names(__name__, {'Plane': 'plane'})\n")
    got = imported(src, "dpobs_otel.adapters.mod")
    assert {"torch.nn", "tensordict", "dpobs_otel.adapters.sibling",
            "dpobs_otel.up.thing", "msgpack", "verl", "dpobs_otel.testing.step_worker",
            "dpobs_otel.adapters.mod.plane"} <= got


LOCK = {"python": "3.12.7 cpython-312 x86_64", "reqs": ["torch==2.11.0", "ray[default]"],
        "opts": [], "wheel_requires": ["numpy>=1.24", "torch>=2.9"],
        "constraints": "torch<=2.14.1\n"}


@pytest.mark.parametrize("change", [
    {"reqs": ["torch==2.12.0", "ray[default]"]},              # a pin moved
    {"reqs": ["torch==2.11.0", "ray[default]", "numpy<2"]},   # a pin added
    {"python": "3.12.8 cpython-312 x86_64"},                  # another interpreter
    {"opts": ["--only-binary", ":all:"]},
    {"wheel_requires": ["numpy>=1.24", "torch>=2.10"]},       # pyproject.toml's floor moved
    {"constraints": "torch<=2.15.0\n"},                       # the machine's cap moved
])
def test_a_changed_lock_gives_a_new_key(run, change):
    assert run.lock_key(**{**LOCK, **change}) != run.lock_key(**LOCK)


def test_the_same_lock_gives_the_same_key(run):
    again = {**LOCK, "reqs": list(reversed(LOCK["reqs"]))}  # the order pins are listed in
    assert run.lock_key(**again) == run.lock_key(**LOCK)


@pytest.fixture
def fake_pip(run, monkeypatch, tmp_path):
    """build() with every command recorded instead of run: `python -m venv` makes the
    folder, as it would; the cell's lock is LOCK with its pins."""
    cmds = []

    def sh(cmd, **kw):
        cmds.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[3], "bin").mkdir(parents=True)
        return 0, 0.0, ""

    monkeypatch.setattr(run, "sh", sh)
    monkeypatch.setattr(run, "interpreter", lambda version: f"/py/{version}/bin/python")
    monkeypatch.setattr(run, "wheel", lambda python: tmp_path / "dpobs_otel-1-py3.whl")
    monkeypatch.setattr(run, "python_version", lambda python: python)
    monkeypatch.setattr(run, "wheel_requires", lambda whl: LOCK["wheel_requires"])
    monkeypatch.setattr(run, "pip_constraints", lambda: LOCK["constraints"])
    monkeypatch.setattr(run, "installed", lambda python: {"torch": "2.11.0"})
    return cmds


def made(cmds) -> list[str]:
    """What build() ran: 'venv', 'install' (the cell's requirements) or 'wheel' (only the
    dpobs-otel wheel, reinstalled)."""
    return ["venv" if "venv" in c else "wheel" if "--force-reinstall" in c else "install"
            for c in cmds]


def test_a_cell_s_virtualenv_is_built_once_per_lock_and_its_wheel_every_run(run, fake_pip,
                                                                          tmp_path):
    cache = tmp_path / "cache"
    cell = {"name": "verl-0.9", "python": "3.12", "pins": ["torch==2.11.0"]}
    first = run.build(cell, "test", cache)
    assert made(fake_pip) == ["venv", "install"] and not first["reused"]
    fake_pip.clear()
    second = run.build(cell, "test", cache)
    assert made(fake_pip) == ["wheel"] and second["reused"]
    assert second["venv"] == first["venv"]
    assert fake_pip[0][-1] == str(tmp_path / "dpobs_otel-1-py3.whl")
    fake_pip.clear()
    moved = run.build({**cell, "pins": ["torch==2.12.0"]}, "test", cache)
    assert made(fake_pip) == ["venv", "install"] and not moved["reused"]
    assert [p.name for p in (cache / "venvs").iterdir()] == [moved["venv"].name]
    other = run.build({**cell, "name": "verl"}, "test", cache)  # a name this one starts with
    assert sorted(p.name for p in (cache / "venvs").iterdir()) == sorted(
        [moved["venv"].name, other["venv"].name])


def test_an_unfinished_or_old_build_is_built_again(run, fake_pip, tmp_path, monkeypatch):
    """No stamp (the build stopped half way) or a stamp older than CACHE_DAYS (the unpinned
    requirements may have moved on): built again, in the same place."""
    cache = tmp_path / "cache"
    cell = {"name": "newest", "python": "3.13", "pins": []}
    first = run.build(cell, "test", cache)
    (first["venv"] / run.STAMP).unlink()
    fake_pip.clear()
    assert not run.build(cell, "test", cache)["reused"]
    assert made(fake_pip) == ["venv", "install"]
    monkeypatch.setattr(run, "CACHE_DAYS", 0)
    fake_pip.clear()
    assert not run.build(cell, "test", cache)["reused"]
    assert made(fake_pip) == ["venv", "install"]


def test_a_cached_virtualenv_that_takes_no_wheel_is_built_again(run, fake_pip, tmp_path,
                                                                 monkeypatch):
    cache = tmp_path / "cache"
    cell = {"name": "floor", "python": "3.11", "pins": ["numpy==1.24.0"]}
    first = run.build(cell, "test", cache)
    fake_pip.clear()
    recorded = run.sh

    def sh(cmd, **kw):  # the wheel's reinstall fails, every other command as before
        if "--force-reinstall" in cmd:
            fake_pip.append(cmd)
            return 1, 0.0, "ERROR: a broken virtualenv"
        return recorded(cmd, **kw)

    monkeypatch.setattr(run, "sh", sh)
    again = run.build(cell, "test", cache)
    assert made(fake_pip) == ["wheel", "venv", "install"]
    assert not again["reused"] and again["error"] is None and again["venv"] == first["venv"]
    assert (again["venv"] / run.STAMP).exists()


def test_without_a_cache_every_run_builds(run, fake_pip, tmp_path, monkeypatch):
    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    cell = {"name": "roll", "python": "3.10", "pins": ["numpy<2"]}
    for _ in range(2):
        fake_pip.clear()
        built = run.build(cell, "test", None)
        assert made(fake_pip) == ["venv", "install"] and not built["reused"]
        assert built["venv"] == tmp_path / "work" / "venvs" / "roll"


def test_no_pip_command_turns_its_download_cache_off(run):
    """Downloads are reused through pip's own cache: nothing in the runner may disable it."""
    text = RUN.read_text()
    assert "--no-cache-dir" not in text and "PIP_NO_CACHE_DIR" not in text


def test_the_lock_reads_the_wheel_s_requirements_and_the_interpreter(run, tmp_path):
    """The parts of the lock read from outside: the wheel's METADATA (its dependencies and
    every extra's) and the interpreter's exact version."""
    import sys
    import zipfile

    whl = tmp_path / "dpobs_otel-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("dpobs_otel-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: dpobs-otel\nRequires-Dist: torch>=2.9\n"
                   "Provides-Extra: ray\nRequires-Dist: ray<3,>=2.49; extra == \"ray\"\n\n"
                   "Requires-Dist: in the description, not a requirement\n")
    assert run.wheel_requires(whl) == ["torch>=2.9", 'ray<3,>=2.49; extra == "ray"']
    got = run.python_version(sys.executable)
    assert got.split()[0] == ".".join(map(str, sys.version_info[:3]))


def test_the_demo_check_every_cell_runs_passes_on_the_suite_s_own_versions(tmp_path):
    """compat/demo_check.py calls into the demo's modules by name; run it whole here, where a
    renamed function fails make test instead of every cell of the landing matrix."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(ROOT / "compat" / "demo_check.py"),
                          "--log-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo truth check ok" in out.stdout
