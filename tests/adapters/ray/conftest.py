"""Ray's object store (dpobs_otel/adapters/ray): jobs run as a user runs them, each in a
subprocess with its own local Ray (helpers/ray_runs.py), so the driver and every worker start
dpobs the zero-code way."""
from __future__ import annotations

import pytest

from helpers.ray_runs import run_job


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The verl-shaped job under DPOBS_AUTO=1, its variables passed to the actors through
    runtime_env (the job does that itself, as a user would)."""
    tmp = tmp_path_factory.mktemp("ray-measured")
    return run_job(tmp, DPOBS_AUTO="1", DPOBS_SD_DIR=str(tmp / "sd"), DPOBS_JOB="rayjob")
