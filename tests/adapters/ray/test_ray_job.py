"""The verl-shaped Ray job (tests/helpers/ray_job.py), unchanged, under DPOBS_AUTO=1: every
process it runs serves /metrics through file_sd, and each op's counts, keys and bytes equal
what the job itself counted and what Ray reports as object sizes. The same job without dpobs,
and with dpobs switched off, returns byte-identical results; switched off, nothing serves."""
from __future__ import annotations

import pytest

from dpobs_otel import names

from helpers.ray_runs import run_job, sample

OP = names.OP_DURATION_SERIES


def _process(job: dict, role: str) -> list:
    found = [m["samples"] for m in job["metrics"]
             if m["labels"]["role"] == role and m["samples"] is not None]
    assert len(found) == 1, (role, [m["labels"] for m in job["metrics"]])
    return found[0]


_value = sample  # None for a series the process does not serve


def test_every_process_serves_through_file_sd_with_its_actor_class_as_role(measured):
    roles = sorted(m["labels"]["role"] for m in measured["metrics"])
    # The killed Rollout's file stays behind it, unreachable: two Rollout entries.
    assert roles == ["Critic", "Rollout", "Rollout", "Scorer", "driver"]
    assert {m["labels"]["job"] for m in measured["metrics"]} == {"rayjob"}


def test_puts_count_every_chunk_at_ray_s_object_size(measured):
    driver = _process(measured, "driver")
    sizes = measured["put_sizes"]
    assert _value(driver, OP + "_count", op="ray_put") == len(sizes)
    assert _value(driver, names.KEYS_SERIES, op="ray_put") == len(sizes)
    assert _value(driver, names.TRANSFERRED_SERIES, op="ray_put", direction="write") == sum(
        sizes)
    assert _value(driver, names.RAY_OWNED_SERIES) == sum(sizes)  # the job still holds them


@pytest.mark.parametrize("method,by_value", [("Rollout.generate_sequences", 0),
                                             ("Scorer.score", 2),
                                             ("Critic.compute_values", 1)])
def test_calls_and_the_gets_that_collect_them_carry_the_method(measured, method, by_value):
    driver = _process(measured, "driver")
    calls = measured["calls"][method]
    assert _value(driver, OP + "_count", op="ray_call", method=method) == calls
    # keys: the arguments passed by value (a ref is passed by reference; a keyword's name
    # and Ray's positional markers are not arguments)
    assert _value(driver, names.KEYS_SERIES, op="ray_call", method=method) == by_value
    assert _value(driver, OP + "_count", op="ray_get", method=method) == 1
    assert _value(driver, names.KEYS_SERIES, op="ray_get", method=method) == calls
    assert _value(driver, names.TRANSFERRED_SERIES, op="ray_get", method=method,
                  direction="read") == measured["result_sizes"][method]


def test_workers_measure_their_side_of_each_call(measured):
    driver, scorer = _process(measured, "driver"), _process(measured, "Scorer")
    sent = _value(driver, names.TRANSFERRED_SERIES, op="ray_call", method="Scorer.score",
                  direction="write")
    assert sent > 0
    assert _value(scorer, names.TRANSFERRED_SERIES, op="ray_args", method="Scorer.score",
                  direction="read") == sent
    assert _value(scorer, names.KEYS_SERIES, op="ray_args", method="Scorer.score") == 2
    assert _value(scorer, names.TRANSFERRED_SERIES, op="ray_return", method="Scorer.score",
                  direction="write") == measured["result_sizes"]["Scorer.score"]
    rollout = _process(measured, "Rollout")  # the live one: one chunk by reference
    assert _value(rollout, names.TRANSFERRED_SERIES, op="ray_args",
                  method="Rollout.generate_sequences", direction="read") in measured[
        "put_sizes"]
    # The async Critic awaited a ref handed to it inside a list: a ray_get of one key, the
    # put's size, and no method (no call of its process returned that ref).
    critic = _process(measured, "Critic")
    assert _value(critic, OP + "_count", op="ray_get") == 1
    assert _value(critic, names.TRANSFERRED_SERIES, op="ray_get",
                  direction="read") == measured["put_sizes"][1]
    assert _value(critic, OP + "_count", op="ray_return", method="Critic.compute_values") == 1


def test_errors_count_on_the_getter_by_class(measured):
    driver = _process(measured, "driver")
    errors = measured["errors"]
    assert errors["Scorer.slow"] == "GetTimeoutError"
    assert errors["Scorer.boom"] == "RayTaskError(ValueError)"
    assert errors["Rollout.ping"] is not None  # the killed actor
    for method, error_type in errors.items():
        assert _value(driver, names.OP_ERRORS_SERIES, op="ray_get", method=method,
                      error_type=error_type) == 1, (method, error_type)


def test_ray_ops_are_not_data_plane_time_and_ray_s_internals_are_not_measured(measured):
    # An older OpenTelemetry SDK (the floor cell's) lacks private names dpobs reads: each
    # process then counts those fallbacks under otel_sdk at its start, by design, and fails
    # nowhere else. The driver says which; where it names none, no error is allowed at all.
    # A Ray before 2.60 lacks ObjectRef._on_ready: each process that gets says so once,
    # under ray_private (adapters/ray/locality.py), and only once.
    import ray
    by_design = {names.OTEL_SDK_COMPONENT} if measured["sdk_degradations"] else set()
    once = set() if hasattr(ray.ObjectRef, "_on_ready") else {names.COMPONENT_RAY_PRIVATE}
    for m in measured["metrics"]:
        for name, labels, value in m["samples"] or []:
            assert not labels.get("method", "").startswith("__ray"), labels
            if name in (names.STEP_BUSY_SERIES, names.STEP_EXPOSED_SERIES,
                        names.OUTSTANDING_SIZE_SERIES, names.OUTSTANDING_KEYS_SERIES):
                assert value == 0, (m["labels"], name)
            if name != names.INSTR_ERRORS_SERIES or labels["component"] in by_design:
                continue
            if labels["component"] not in once or value != 1:
                raise AssertionError(f"dpobs failed inside {m['labels']}: {labels} {value}")


def test_results_are_byte_identical_without_dpobs_and_switched_off(measured, tmp_path):
    plain = run_job(tmp_path / "plain")
    off = run_job(tmp_path / "off", DPOBS_AUTO="1", DPOBS_DISABLED="1",
                  DPOBS_SD_DIR=str(tmp_path / "off-sd"))
    assert measured["digest"] == plain["digest"] == off["digest"]
    assert measured["put_sizes"] == plain["put_sizes"] == off["put_sizes"]
    assert plain["metrics"] == off["metrics"] == []  # switched off: nothing registered
    assert not (tmp_path / "off-sd").exists() or not list((tmp_path / "off-sd").iterdir())
