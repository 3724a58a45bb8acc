"""The product as a user gets it: the built wheel in a fresh virtualenv, run from a directory
outside the checkout, with nothing from the network (the suite has none: `make install`
fills .wheels/ beforehand)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".wheels"
EXTRAS = "dashboards,instrument,top"

pytestmark = pytest.mark.slow


def _run(cmd, cwd, timeout=600, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert r.returncode == 0, f"{cmd}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    return r.stdout


def contract_names(category: str) -> set[str]:
    """The names contract.yml marks built (tests/test_contract.py holds it to DESIGN.md)."""
    entries = yaml.safe_load((REPO / "contract.yml").read_text())[category]
    return {name for name, status in entries.items() if status == "built"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if not (WHEELS / ".downloaded").exists():
        pytest.fail(f"{WHEELS} is not filled: run `make install` (it downloads the wheels the "
                    "suite installs offline)")
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dist), str(REPO)], cwd=tmp)
    [wheel] = dist.glob("dpobs_otel-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
           "--find-links", str(WHEELS)]
    _run(pip + ["torch==2.13.0"], cwd=tmp)  # first, from the local file
    _run(pip + [f"{wheel}[{EXTRAS}]"], cwd=tmp)
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, work


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    venv, work = installed
    out = _run([str(venv / "bin" / "python"), "-c",
                "import dpobs_otel; print(dpobs_otel.__file__)"], cwd=work)
    path = Path(out.strip()).resolve()
    assert venv.resolve() in path.parents and REPO not in path.parents


def test_mixin_from_the_wheel_carries_every_built_rule_and_alert(installed):
    venv, work = installed
    _run([str(venv / "bin" / "dpobs"), "mixin", "--out", "out"], cwd=work)
    out = work / "out"
    for sub in ("prometheus/prometheus.yml", "prometheus/central.yml", "alertmanager",
                "grafana/provisioning", "kubernetes", "dashboards"):
        assert (out / sub).exists(), sub
    [rule_doc] = [d for p in (out / "kubernetes").glob("*.yaml")
                  for d in yaml.safe_load_all(p.read_text())
                  if d and d.get("kind") == "PrometheusRule"]
    rules = [r for g in rule_doc["spec"]["groups"] for r in g["rules"]]
    records, alerts = contract_names("records"), contract_names("alerts")
    assert records and alerts
    assert records <= {r.get("record") for r in rules}
    assert alerts <= {r.get("alert") for r in rules}


def test_demo_runs_from_the_wheel_outside_the_checkout(installed):
    venv, work = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    out = _run([str(venv / "bin" / "dpobs"), "demo", "--steps", "10"], cwd=work, env=env)
    assert "frac_of_step" in out


def test_the_auto_switch_ships_in_the_wheel(installed):
    venv, work = installed
    probe = ("import sys; print(any(type(f).__module__ == 'dpobs_otel.auto' "
             "for f in sys.meta_path))")
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    assert _run([py, "-c", probe], cwd=work, env={**env, "DPOBS_AUTO": "1"}).strip() == "True"
    assert _run([py, "-c", probe], cwd=work, env=env).strip() == "False"


def test_the_guards_c_kernel_ships_in_the_wheel(installed):
    venv, work = installed
    probe = ("from dpobs_otel.guard import kernel; import torch; "
             "print(kernel.LIB is not None and kernel.usable(torch.zeros(4, dtype=torch.int32)))")
    assert _run([str(venv / "bin" / "python"), "-c", probe], cwd=work).strip() == "True"


def test_the_ray_adapter_s_c_op_path_ships_in_the_wheel(installed):
    venv, work = installed
    probe = "from dpobs_otel.adapters.ray import ops; print(ops.FAST is not None)"
    assert _run([str(venv / "bin" / "python"), "-c", probe], cwd=work).strip() == "True"
