"""Settings as DESIGN.md's Public API says: a variable of the environment never raises and
never stops the program, however dpobs was started (dpobs.start() in code, or an
instrumentor's first call: DPOBS_AUTO=1 and opentelemetry-instrument both go that way);
ONE line on stderr names the variable, its value and what dpobs does instead; unmeasured,
the program's client is handed back as it is. A traceback only with DPOBS_DEBUG=1. An
argument in code that is wrong raises ValueError naming it (tests/test_telemetry.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

# The program a newcomer writes: start, instrument, one step with a put and a get.
PROGRAM = """
import contextlib
import dpobs_otel as dpobs
inner = dpobs.InMemoryDataPlane()
{start}
with step():
    client.put_samples(["a"], "p")
    client.get_samples(["a"], "p")
print("measured" if client is not inner else "unmeasured")
"""
STARTS = {
    "code": "tel = dpobs.start()\nclient = tel.instrument(inner)\nstep = tel.step",
    # what DPOBS_AUTO=1 and opentelemetry-instrument run on an instrumented library's first
    # call: the process's Telemetry started from the environment (adapters/instrumentation.py)
    "instrumentor": ("from dpobs_otel.adapters.instrumentation import PerProcess\n"
                     "p = PerProcess(lambda t: t.instrument(inner), 'probe')\n"
                     "client, tel = p.adapter() or inner, p.telemetry()\n"
                     "step = tel.step if tel is not None else contextlib.nullcontext"),
}
DEFAULT = "using the default"
UNMEASURED = "runs unmeasured"
# (variables set, the one named in the line, what dpobs does instead, measured?)
CASES = [
    ({"DPOBS_ROLE": ""}, "DPOBS_ROLE", DEFAULT + " 'trainer'", True),
    ({"DPOBS_RANK": "abc"}, "DPOBS_RANK", DEFAULT + " 0", True),
    ({"RANK": "abc"}, "RANK", DEFAULT + " 0", True),
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID", DEFAULT + " 0", True),
    ({"DPOBS_JOB": ""}, "DPOBS_JOB", DEFAULT + " 'dpobs'", True),
    ({"OTEL_SERVICE_NAME": ""}, "OTEL_SERVICE_NAME", DEFAULT + " 'dpobs'", True),
    ({"DPOBS_HOST": "nohost.invalid"}, "DPOBS_HOST", UNMEASURED, False),
    ({"DPOBS_PORT": "99999"}, "DPOBS_PORT", DEFAULT + " 0", True),
    ({"DPOBS_SD_DIR": "/proc/dpobs-sd"}, "DPOBS_SD_DIR", "no file_sd target", True),
    ({"DPOBS_VERIFY_TENSOR_HASH": "maybe"}, "DPOBS_VERIFY_TENSOR_HASH", DEFAULT + " False",
     True),
    ({"DPOBS_WEIGHTS_IN_BAND": "maybe"}, "DPOBS_WEIGHTS_IN_BAND", DEFAULT + " False", True),
    ({"DPOBS_TLS_CERTFILE": "/nope.pem"}, "DPOBS_TLS_CERTFILE", UNMEASURED, False),
    ({"DPOBS_TLS_KEYFILE": "/nope.key"}, "DPOBS_TLS_KEYFILE", UNMEASURED, False),
    ({"DPOBS_TLS_CERTFILE": "/nope.pem", "DPOBS_TLS_KEYFILE": "/nope.key"},
     "DPOBS_TLS_CERTFILE", UNMEASURED, False),
    ({"DPOBS_TLS_CLIENT_CAFILE": "/nope.ca"}, "DPOBS_TLS_CLIENT_CAFILE", UNMEASURED, False),
    ({"DPOBS_RECONCILE_ROWS": "0"}, "DPOBS_RECONCILE_ROWS", DEFAULT + " 16384", True),
    ({"DPOBS_ROW_AGE": "maybe"}, "DPOBS_ROW_AGE", DEFAULT + " False", True),
    ({"DPOBS_TRACE": "maybe"}, "DPOBS_TRACE", DEFAULT + " False", True),
    ({"DPOBS_TRACE_RING": "0"}, "DPOBS_TRACE_RING", DEFAULT + " 16384", True),
    ({"DPOBS_TRACE_EVERY": "x"}, "DPOBS_TRACE_EVERY", DEFAULT + " 1", True),
    ({"DPOBS_TQ_METRICS": "maybe"}, "DPOBS_TQ_METRICS", DEFAULT + " False", True),
    ({"DPOBS_DISABLED": "maybe"}, "DPOBS_DISABLED", "stays off", False),
    ({"OTEL_SDK_DISABLED": "maybe"}, "OTEL_SDK_DISABLED", "stays off", False),
    ({"DPOBS_DEBUG": "maybe"}, "DPOBS_DEBUG", "no tracebacks", True),
    ({"DPOBS_TRACE": "1", "OTEL_TRACES_EXPORTER": "otlp",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL",
     "none exported", True),
]


def _clean_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DPOBS_", "OTEL_")) and k not in ("RANK", "SLURM_PROCID")}
    env.update(extra)
    return env


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def _one_line(r: subprocess.CompletedProcess, var: str, value: str, instead: str) -> None:
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-2000:]
    assert f"{var}={value!r}" in lines[0] and instead in lines[0], lines[0]


# Each variable started from code; through an instrumentor, the three and one of
# each other outcome (a process pays torch's import: 2-3 s of CPU each).
THROUGH_INSTRUMENTOR = {"DPOBS_RANK", "DPOBS_PORT", "DPOBS_SD_DIR", "DPOBS_HOST",
                        "DPOBS_TLS_CERTFILE", "DPOBS_DISABLED"}
RUNS = [pytest.param(how, *case, id="+".join(f"{k}={v}" for k, v in case[0].items())
                     + "-" + how)
        for case in CASES for how in sorted(STARTS)
        if how == "code" or case[1] in THROUGH_INSTRUMENTOR]


@pytest.mark.parametrize("how,env,var,instead,measured", RUNS)
def test_a_bad_variable_is_one_line_and_the_program_runs(how, env, var, instead, measured):
    r = _run(PROGRAM.format(start=STARTS[how]), _clean_env(**env))
    _one_line(r, var, env[var], instead)
    assert r.stdout.split() == ["measured" if measured else "unmeasured"]


@pytest.mark.parametrize("how", sorted(STARTS))
def test_a_port_in_use_gives_way_to_a_free_one(how):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        r = _run(PROGRAM.format(start=STARTS[how]), _clean_env(DPOBS_PORT=port))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.splitlines() == [f"dpobs: DPOBS_PORT={port} is already in use; serving "
                                     f"on any free port instead"]
    assert r.stdout.split() == ["measured"]


@pytest.mark.parametrize("value,instead", [("maybe", "nothing is hooked"),
                                           ("1", "stays off")])
def test_dpobs_auto_hook_says_its_bad_values_in_one_line(value, instead):
    """The start-up hook (dpobs-otel-auto.pth) runs in every interpreter: a malformed
    DPOBS_AUTO, or an off switch it reads, is one line and the program runs on."""
    env = _clean_env(DPOBS_AUTO=value, DPOBS_DISABLED="maybe")
    r = _run("print('ran')", env)
    var = "DPOBS_AUTO" if value == "maybe" else "DPOBS_DISABLED"
    _one_line(r, var, env[var], instead)
    assert r.stdout.split() == ["ran"]


def test_a_traceback_only_with_dpobs_debug():
    code = PROGRAM.format(start=STARTS["code"])
    quiet = _run(code, _clean_env(DPOBS_SD_DIR="/proc/dpobs-sd"))
    loud = _run(code, _clean_env(DPOBS_SD_DIR="/proc/dpobs-sd", DPOBS_DEBUG="1"))
    assert quiet.returncode == loud.returncode == 0
    assert "Traceback" not in quiet.stderr and len(quiet.stderr.splitlines()) == 1
    assert "Traceback" in loud.stderr and "DPOBS_SD_DIR='/proc/dpobs-sd'" in loud.stderr
