"""compat/run.py's choice of checks per cell (`--checks`), which .ci/run relies on to run
each cell of the matrix it can afford: read from the script itself, not a copy."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "compat" / "run.py"


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
