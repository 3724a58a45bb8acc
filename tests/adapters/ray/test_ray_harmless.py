"""dpobs is invisible to a Ray program (tests/helpers/ray_view.py): with DPOBS_AUTO=1 the entry
points dpobs replaces keep their signatures and `inspect` answers, refs and results keep their
types and values, and exceptions their classes and messages; switched off (DPOBS_DISABLED,
OTEL_SDK_DISABLED) nothing of Ray is even replaced; and each dpobs component on a Ray op's
path raising on purpose leaves every op counted and the program's view unchanged."""
from __future__ import annotations

import pytest

from helpers.ray_runs import run_job
from helpers.ray_view import BREAKABLE

VIEW = "helpers.ray_view"


def _program(view: dict) -> dict:
    """What the program sees: the view less dpobs's own account and the replaced marks."""
    out = {k: v for k, v in view.items() if k != "own"}
    out["entry_points"] = {name: {k: v for k, v in ep.items() if k != "replaced"}
                           for name, ep in view["entry_points"].items()}
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("view-plain"), VIEW)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("view-auto"), VIEW, DPOBS_AUTO="1")


def test_a_measured_program_sees_what_a_plain_one_sees(plain, measured):
    assert not any(ep["replaced"] for ep in plain["entry_points"].values())
    assert all(ep["replaced"] for ep in measured["entry_points"].values())
    assert _program(measured) == _program(plain)
    assert measured["raised"]["class"] == "RayTaskError(KeyError)"
    assert measured["own"]["calls"]["ray_put"] == 1 and measured["own"]["errors"] == 0


@pytest.mark.parametrize("switch", [{"DPOBS_DISABLED": "1"}, {"OTEL_SDK_DISABLED": "true"}])
def test_switched_off_nothing_of_ray_is_replaced(plain, tmp_path, switch):
    off = run_job(tmp_path, VIEW, DPOBS_AUTO="1", **switch)
    assert not any(ep["replaced"] for ep in off["entry_points"].values())
    assert off == plain


@pytest.mark.parametrize("component", sorted(BREAKABLE))
def test_a_failing_component_leaves_every_op_counted_and_the_program_unchanged(
        plain, measured, tmp_path, component):
    broken = run_job(tmp_path, VIEW, DPOBS_AUTO="1", RAYVIEW_BREAK=component)
    assert _program(broken) == _program(plain)
    assert broken["own"]["calls"] == measured["own"]["calls"]
    assert broken["own"]["errors"] >= 1, component


def test_a_ray_lacking_a_private_name_keeps_the_public_ops_counted(plain, tmp_path):
    """Where a private name dpobs reads is gone, ray.put, ray.get and ray.wait are still
    counted and timed, the calls' hooks are not put in place, the gap is counted once under
    ray_private, and the program sees what it sees without dpobs."""
    lacking = run_job(tmp_path, VIEW, DPOBS_AUTO="1", RAYVIEW_LACK="1")
    assert _program(lacking) == _program(plain)
    replaced = {name: ep["replaced"] for name, ep in lacking["entry_points"].items()}
    assert replaced == {"ray.put": True, "ray.get": True, "ray.wait": True,
                        "ActorMethod._remote": False, "RemoteFunction._remote": False}
    calls = lacking["own"]["calls"]
    assert calls["ray_put"] == 1 and calls["ray_wait"] == 1 and calls["ray_get"] >= 4
    assert "ray_call" not in calls
    # Once for the name taken away, and once more on a Ray before 2.60, which lacks what
    # tells when an object is made (ObjectRef._on_ready: adapters/ray/locality.py).
    import ray
    said = 1 + (not hasattr(ray.ObjectRef, "_on_ready"))
    assert lacking["own"]["lacking"] == said and lacking["own"]["errors"] == 0
