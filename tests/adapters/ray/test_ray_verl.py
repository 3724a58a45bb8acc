"""verl 0.9.1's real single controller (tests/helpers/ray_verl.py), unchanged, on the CPU under
DPOBS_AUTO=1: verl's parallel_put, its calls to every worker and func_generator's ray.get are
counted in the driver with the method the program called (a plain RayWorkerGroup's
`Rollout.generate_sequences`, a fused group's `FusedWorker_actor_critic.actor.generate_sequences`,
never the `_fuw_execute` dispatcher), at Ray's object sizes, and each worker measures its side;
the results are byte-identical to the same program without dpobs."""
from __future__ import annotations

import importlib.util

import pytest

from dpobs_otel import names

from helpers.ray_runs import run_job, sample

OP = names.OP_DURATION_SERIES
BYTES = names.TRANSFERRED_SERIES
MODULE = "helpers.ray_verl"


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    if importlib.util.find_spec("verl") is None:  # a compat cell without verl (nemo-rl)
        pytest.skip("verl is not installed beside this Ray")
    tmp = tmp_path_factory.mktemp("ray-verl")
    return run_job(tmp, module=MODULE, DPOBS_AUTO="1", DPOBS_SD_DIR=str(tmp / "sd"),
                   DPOBS_JOB="verljob")


def _processes(job: dict, role: str) -> list[list]:
    return [m["samples"] for m in job["metrics"] if m["labels"]["role"] == role]


def _value(samples, name, **labels) -> float:
    """The one sample of `name` with exactly `labels` (0 when there is none)."""
    return sample(samples, name, 0, **labels)


def _driver(job: dict) -> list:
    (driver,) = _processes(job, "driver")
    return driver


def _total(samples, op: str, prefix: str = "") -> float:
    """Bytes of `op` summed over every method that starts with `prefix`."""
    return sum(v for n, l, v in samples if n == BYTES and l.get("op") == op
               and l.get("method", "").startswith(prefix))


def test_the_driver_and_every_worker_serve_with_the_actor_class_as_role(verl):
    # (verl's get_master_addr_port tasks run in a pooled task worker, role ray-task)
    roles = sorted(m["labels"]["role"] for m in verl["metrics"])
    actors = [verl["fused_class"]] * verl["world"] + ["Rollout"] * verl["world"] + ["driver"]
    assert [r for r in roles if r != "ray-task"] == sorted(actors)
    assert all(m["samples"] for m in verl["metrics"])


def test_every_call_verl_made_is_counted_once_per_worker_with_its_method(verl):
    driver = _driver(verl)
    for method, served in verl["served"].items():
        assert served == verl["rounds"] * verl["world"], (method, served)  # one call per worker
        assert _value(driver, OP + "_count", op="ray_call", method=method) == served, method
        # func_generator collects each group call with one ray.get of one ref per worker
        assert _value(driver, OP + "_count", op="ray_get", method=method) == verl["rounds"]
        assert _value(driver, names.KEYS_SERIES, op="ray_get", method=method) == served


def test_parallel_put_counts_every_chunk_at_ray_s_object_size(verl):
    driver, put = _driver(verl), verl["sizes"]["put"]
    assert _value(driver, OP + "_count", op="ray_put") == len(put)
    assert _value(driver, names.KEYS_SERIES, op="ray_put") == len(put)
    assert _value(driver, BYTES, op="ray_put", direction="write") == sum(put)
    # the chunks travel by ref: the nd-dispatched call passes nothing by value
    assert _value(driver, names.KEYS_SERIES, op="ray_call",
                  method="Rollout.generate_sequences") == 0


def test_the_gets_that_collect_a_method_read_ray_s_sizes_of_its_results(verl):
    driver, returned = _driver(verl), verl["sizes"]["returned"]
    fused = verl["fused_class"]
    # The plain and the fused group run the same Rollout code on the same chunks.
    for method in ("Rollout.generate_sequences", f"{fused}.actor.generate_sequences"):
        assert _value(driver, BYTES, op="ray_get", method=method, direction="read") == sum(
            returned), method


def test_workers_measure_their_side_of_each_method(verl):
    driver, rounds = _driver(verl), verl["rounds"]
    rollouts, fused = _processes(verl, "Rollout"), _processes(verl, verl["fused_class"])
    for method in ("Rollout.generate_sequences", "Rollout.update_actor"):
        for worker in rollouts:  # each worker's own calls
            assert _value(worker, OP + "_count", op="ray_args", method=method) == rounds
            assert _value(worker, OP + "_count", op="ray_return", method=method) == rounds
        assert sum(_value(w, BYTES, op="ray_return", method=method, direction="write")
                   for w in rollouts) == _value(driver, BYTES, op="ray_get", method=method,
                                                direction="read")
    # update_actor's chunks go by value (Ray stores each itself): what the driver sent is
    # what the workers read
    method = "Rollout.update_actor"
    sent = _value(driver, BYTES, op="ray_call", method=method, direction="write")
    assert sent > 0 and sent == sum(
        _value(w, BYTES, op="ray_args", method=method, direction="read") for w in rollouts)
    for method in verl["served"]:
        if method.startswith(verl["fused_class"]):
            for worker in fused:  # args and returns named for the carried method
                assert _value(worker, OP + "_count", op="ray_args", method=method) == rounds
                assert _value(worker, OP + "_count", op="ray_return", method=method) == rounds
    # every byte the fused workers returned is read back by the driver's gets
    fused_gets = _total(driver, "ray_get", verl["fused_class"] + ".")
    assert fused_gets > 0 and fused_gets == sum(_total(w, "ray_return") for w in fused)


def test_no_dispatcher_or_ray_internal_names_and_no_dpobs_failure(verl):
    for m in verl["metrics"]:
        for name, labels, _ in m["samples"]:
            method, op = labels.get("method", ""), labels.get("op")
            assert not method.startswith("__ray"), labels
            assert "_fwmn_" not in method, labels
            if op in ("ray_call", "ray_get", "ray_args", "ray_return"):
                assert not method.endswith("._fuw_execute"), labels
            assert name != names.INSTR_ERRORS_SERIES, (m["labels"], labels)


def test_results_are_byte_identical_without_dpobs(verl, tmp_path):
    plain = run_job(tmp_path / "plain", module=MODULE)
    assert plain["metrics"] == []
    assert verl["digest"] == plain["digest"]
    assert verl["served"] == plain["served"]
    assert verl["sizes"] == plain["sizes"]
