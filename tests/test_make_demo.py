"""`make demo` builds an environment with only what the demo needs (issue 56: it installed the
suite's 2.2 GB, test tools, docs toolchain, verl, NIXL, transformers and Mooncake included,
to run the demo on the built-in store). Read from `make -n`, which prints the recipes and
runs none; the venv's path is pointed at a folder that does not exist, so the install's
recipe is printed however the checkout's own .venv-demo stands."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What the suite's .venv has and the demo on the built-in store never imports.
NOT_FOR_THE_DEMO = ("test", "docs", "verl", "nixl", "transformers", "mooncake",
                    "transferqueue", "ray", "dashboards", "instrument")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_torch_and_the_package_with_the_report_extra_only(tmp_path):
    venv = tmp_path / "absent" / "venv"
    recipe = subprocess.run(["make", "-n", "-C", str(REPO), "demo", f"DEMO_VENV={venv}"],
                            capture_output=True, text=True, check=True).stdout
    installs = [ln for ln in recipe.splitlines() if " install " in ln]
    assert installs and all(ln.startswith(f"{venv}/bin/pip install") for ln in installs)
    # pip itself, torch pinned first, then the package and the picture's extra
    wanted = [re.sub(r"^.*pip install -q ", "", ln) for ln in installs]
    assert wanted == ["--upgrade pip", "-c constraints/suite.txt torch",
                      "-c constraints/suite.txt -e '.[report]'"], wanted
    for name in NOT_FOR_THE_DEMO:
        assert not re.search(rf"\b{name}\b", " ".join(wanted)), name
    assert f"{venv}/bin/dpobs demo" in recipe
    assert ".venv/" not in recipe  # never the suite's environment
