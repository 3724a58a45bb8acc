"""Running a Ray job as a user runs it: `python -m MODULE OUT.json` in a subprocess with its own
local Ray on 127.0.0.1, in this process's environment less its DPOBS_* and OTEL_* variables
plus the ones a test gives (tests/adapters/ray); and the job modules' side of it (job_main,
forwarded). The pytest process never imports Ray here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dpobs_otel.testing.transferqueue import LOOPBACK_ENV

TESTS = Path(__file__).resolve().parents[1]


def run_job(tmp_path: Path, module: str = "helpers.ray_job", timeout: float = 240,
            **env) -> dict:
    """What `module` wrote to its OUT.json; its stderr in the failure when it exits non-zero."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
    base.update(LOOPBACK_ENV, PYTHONPATH=tests_path(), **env)
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "-m", module, str(out)], env=base, cwd=tmp_path,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


def sample(samples, name, default=None, **labels):
    """The one sample of `name` whose labels, empty ones dropped (the exporter writes a label
    some series of a family lack as ""), are exactly `labels`; `default` when none is."""
    want = {k: str(v) for k, v in labels.items()}
    hits = [v for n, have, v in samples if n == name
            and {k: x for k, x in have.items() if x != ""} == want]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else default


def forwarded() -> dict:
    """The env_vars a job hands its actors through runtime_env, as a user would: its DPOBS_*
    and OTEL_* variables, and the path the actors import the job's classes from."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("DPOBS_", "OTEL_"))}
    env["PYTHONPATH"] = tests_path()
    return env


def tests_path() -> str:
    """PYTHONPATH for a job and its actors: the tests' helpers, before whatever this process
    was given (a checkout's own tree, which must win over an installed dpobs-otel in the
    processes it starts too)."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(TESTS)] + ([inherited] if inherited else []))


def job_main(produce, **init) -> None:
    """A job module's main: Ray up on 127.0.0.1 with `init`, produce() written as JSON to the
    path the command line names, Ray down (on an error too)."""
    import ray
    with ray.init(_node_ip_address="127.0.0.1", log_to_driver=False, **init):
        out = produce()
    Path(sys.argv[1]).write_text(json.dumps(out))
