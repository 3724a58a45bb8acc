"""verl weight syncs between real processes, measured with zero code: a trainer and two
rollout workers (helpers.verl_gloo, which never names dpobs) push a model larger than the
backend's bucket over torch.distributed gloo on loopback, through a backend written on
verl's base class, loaded as verl loads a user's (custom_backend_module) and found in its
registry. dpobs comes from the environment alone (DPOBS_AUTO=1, or the OpenTelemetry
launcher where this checkout's entry points are installed).

Exact bytes and tensors against the processes' own counts; every tensor checked on both
receivers; the one bit one receiver's wire flips caught in its version, nothing on the
clean one; the off switch leaves verl's classes as verl made them. Prints what verl's own
trainer timer read beside dpobs for the same syncs, and the bandwidth dpobs measured."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import value
from prometheus_client.parser import text_string_to_metric_families

from dpobs_otel import names
from dpobs_otel.testing.processes import free_port

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl is not installed (the suite installs it: Makefile)", allow_module_level=True)

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
WORLD = 3
SYNCS = 4  # helpers.verl_gloo: versions 1-3, then one with no step
COUNT = names.WEIGHTS_SYNC_DURATION_SERIES + "_count"
SUM = names.WEIGHTS_SYNC_DURATION_SERIES + "_sum"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_", "V_"))}
    env.update(GLOO_SOCKET_IFNAME="lo", OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]),
               **extra)
    return env


def _dpobs_env(launcher: str, rank: int, port: str) -> dict:
    return dict(DPOBS_PORT=port, DPOBS_HOST="127.0.0.1", DPOBS_RANK=str(rank),
                DPOBS_ROLE="trainer" if rank == 0 else "rollout", DPOBS_VERIFY_TENSOR_HASH="1",
                **({"DPOBS_AUTO": "1"} if launcher == "DPOBS_AUTO" else {}))


def _launcher_has_verl() -> bool:
    points = importlib.metadata.entry_points(group="opentelemetry_instrumentor")
    return any(p.value == "dpobs_otel.adapters.verl:VerlInstrumentor" for p in points)


def _argv(launcher: str) -> list[str]:
    python = [sys.executable, "-c", "from helpers.verl_gloo import main; main()"]
    return [LAUNCHER, *python] if launcher == "opentelemetry-instrument" else python


def _samples(text: str) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _push(launcher: str, tmp, measured=range(WORLD)) -> dict:
    """rank -> what helpers.verl_gloo printed, its metrics parsed; the ranks not in
    `measured` run with nothing of dpobs in their environment."""
    procs = {}
    for rank in range(WORLD):
        port = str(free_port())
        env = _env(V_RANK=str(rank), V_WORLD=str(WORLD), V_INIT=f"file://{tmp}/pg",
                   V_METRICS_PORT=port, **(_dpobs_env(launcher, rank, port)
                                           if rank in measured else {}))
        argv = _argv(launcher if rank in measured else "python")
        procs[rank] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = {}
    try:
        for rank, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-4000:]
            out[rank] = json.loads(stdout.strip().splitlines()[-1])
            text = out[rank].pop("metrics")
            out[rank]["samples"] = None if text is None else _samples(text)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return out


@pytest.fixture(scope="module", params=["DPOBS_AUTO", "opentelemetry-instrument"])
def pushed(request, tmp_path_factory):
    if request.param != "DPOBS_AUTO" and not _launcher_has_verl():
        pytest.skip("the installed dpobs-otel has no `verl` entry point (not this checkout's)")
    result = _push(request.param, tmp_path_factory.mktemp("verl"))
    _print_figures(request.param, result)
    return result


def _sent_truth() -> tuple[int, int]:
    from helpers import verl_gloo as vg  # torch: imported once the test runs
    models = [vg.model(v) for v in (*vg.VERSIONS, vg.VERSIONS[-1])]
    return sum(vg.payload(m.values()) for m in models), sum(len(m) for m in models)


def test_bytes_and_tensors_are_exactly_what_moved(pushed):
    nbytes, tensors = _sent_truth()
    sender = pushed[0]["samples"]
    assert value(sender, names.WEIGHTS_TRANSFERRED_SERIES, side="send") == nbytes
    assert value(sender, names.WEIGHTS_TENSORS_SERIES, side="send") == tensors
    assert value(sender, COUNT, side="send") == SYNCS
    assert value(sender, names.WEIGHTS_VERSION_SERIES, side="send") == 3
    for rank in (1, 2):
        samples, truth = pushed[rank]["samples"], pushed[rank]["truth"]
        assert truth["bytes"] == nbytes and truth["tensors"] == tensors
        assert value(samples, names.WEIGHTS_TRANSFERRED_SERIES, side="receive") == nbytes
        assert value(samples, names.WEIGHTS_TENSORS_SERIES, side="receive") == tensors
        assert value(samples, COUNT, side="receive") == SYNCS
        assert value(samples, names.WEIGHTS_VERSION_SERIES, side="receive") == 3


def test_every_tensor_is_checked_and_the_flipped_bit_caught(pushed):
    tensors = _sent_truth()[1]
    clean, corrupted = pushed[2], pushed[1]
    assert clean["truth"]["equal"] == [True] * SYNCS
    assert corrupted["truth"]["equal"] == [True, False, True, True]  # the wire really did it
    for rank, want in ((2, {}), (1, {"value": 1})):
        samples = pushed[rank]["samples"]
        assert value(samples, names.WEIGHTS_CHECKED_SERIES) == tensors
        for reason in names.WEIGHT_MISMATCH_REASONS:
            assert value(samples, names.WEIGHTS_MISMATCHED_SERIES, reason=reason) == \
                want.get(reason, 0), (rank, reason)


def test_zero_code_measured_the_user_s_backend_and_verl_s_own(pushed):
    for rank in range(WORLD):
        assert all(pushed[rank]["patched"].values()), pushed[rank]["patched"]


def test_dpobs_s_send_lies_inside_verl_s_own_timer(pushed):
    verl_s = sum(pushed[0]["verl_timer_s"])
    dpobs_s = value(pushed[0]["samples"], SUM, side="send")
    assert 0 < dpobs_s <= verl_s


def _print_figures(launcher: str, pushed: dict) -> None:
    nbytes = _sent_truth()[0]
    for rank in range(WORLD):
        side = "send" if rank == 0 else "receive"
        dpobs_s = value(pushed[rank]["samples"], SUM, side=side)
        each = pushed[rank]["verl_timer_s"]
        print(f"\nverl gloo [{launcher}] rank {rank} {side}: {SYNCS} syncs, {nbytes / 2**20:.1f} "
              f"MiB; verl marked_timer('update_weights') {sum(each):.3f} s "
              f"({', '.join(f'{t:.3f}' for t in each)}), dpobs {dpobs_s:.3f} s; "
              f"dpobs bandwidth {nbytes / dpobs_s / 2**20:.0f} MiB/s")


def test_a_rollout_without_dpobs_receives_exactly_what_it_does_without_dpobs_anywhere(
        tmp_path):
    from helpers import verl_gloo as vg
    (tmp_path / "guarded").mkdir()
    (tmp_path / "plain").mkdir()
    guarded = _push("DPOBS_AUTO", tmp_path / "guarded", measured=(0,))
    plain = _push("python", tmp_path / "plain", measured=())
    nbytes, tensors = _sent_truth()
    assert value(guarded[0]["samples"], names.WEIGHTS_TENSORS_SERIES, side="send") == tensors
    for rank in (1, 2):
        assert guarded[rank]["samples"] is None and plain[rank]["samples"] is None
        got, want = guarded[rank]["truth"], plain[rank]["truth"]
        assert got["names"] == want["names"] and got["names"][0] == list(vg.SHAPES)
        assert got == want and got["bytes"] == nbytes  # the same bytes, the same tensors


@pytest.mark.parametrize("launcher", ["DPOBS_AUTO", "opentelemetry-instrument"])
@pytest.mark.parametrize("switch", ["DPOBS_DISABLED", "OTEL_SDK_DISABLED"])
def test_the_off_switch_leaves_verl_s_classes_verl_s(launcher, switch):
    argv = _argv(launcher)
    argv[-1] = "import json; from helpers.verl_gloo import patched; print(json.dumps(patched()))"
    env = _env(**{switch: "true"}, **({"DPOBS_AUTO": "1"} if launcher == "DPOBS_AUTO" else {}))
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(seen) > 4 and not any(seen.values()), seen
