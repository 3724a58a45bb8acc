"""The proof out of band under Ray, live: a trainer (this driver) and a rollout actor (its own
process) on a local Ray on loopback, the weights handed to the actor as a method's argument.
The fingerprints travel through the GCS's internal key-value store, never in the items: the
actor's program gets exactly the trainer's names, every tensor is checked, a flipped element
is caught in its version only, and the driver keeps only its last versions posted there."""
from __future__ import annotations

import importlib.util

import pytest
from helpers.weights import model

from dpobs_otel import names
from dpobs_otel.weights import manifest

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (the suite installs it)", allow_module_level=True)

VERSIONS = range(1, 7)
FLIPPED = 3


@pytest.fixture(scope="module")
def ray_local():
    import ray
    ray.init(address="local", num_cpus=1, _node_ip_address="127.0.0.1",
             include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _rollout():
    """The rollout actor's class, made here so that Ray ships it by value (the workers do not
    import the tests)."""

    class Rollout:
        """dpobs started in the actor's own process, the guard on, the default carriage;
        load() returns what its program sees of one version."""

        def __init__(self):
            import dpobs_otel as dpobs
            self.tel = dpobs.start(role="rollout", rank=1, port=0, host="127.0.0.1",
                                   verify_tensor_hash=True)

        def load(self, items, version: int) -> list:
            before = dict(self.tel.weights.meter.stats.mismatched)
            got = list(self.tel.weights.received(iter(items), version=version))
            assert self.tel.weights.settle(30)
            after = self.tel.weights.meter.stats.mismatched
            new = {r: n - before[r] for r, n in after.items() if n > before[r]}
            return [[n for n, _ in got], new]

        def totals(self):
            st = self.tel.weights.meter.stats
            return st.checked, dict(st.unchecked)
    return Rollout


def _flipped(items):
    t = items[1][1].clone()
    t.view(-1)[0] = -t.view(-1)[0] + 1
    return [items[0], (items[1][0], t), *items[2:]]


def test_the_proof_goes_through_ray_s_store_and_never_through_the_items(ray_local, proving):
    ray = ray_local
    s = proving("trainer", in_band=False)
    rollout = ray.remote(_rollout()).remote()
    for v in VERSIONS:
        w = model(v)
        items = list(s.weights.sent(iter(w.items()), version=v))
        assert [n for n, _ in items] == list(w)  # nothing added to what the program moves
        moved = _flipped(items) if v == FLIPPED else items  # flipped on the way
        got, mismatched = ray.get(rollout.load.remote(moved, v))
        assert got == list(w)
        assert mismatched == ({"value": 1} if v == FLIPPED else {}), v
    checked, unchecked = ray.get(rollout.totals.remote())
    assert checked == len(model()) * len(VERSIONS) and not any(unchecked.values())
    assert s.weights.settle(30)
    from ray.experimental import internal_kv
    keys = internal_kv._internal_kv_list(f"weights/{s.settings.job}/",
                                         namespace=manifest.NAMESPACE)
    posted = sorted(int(k.decode().split("/")[-2]) for k in keys)
    assert posted == list(VERSIONS)[-manifest.KEEP:]
    assert not s.stats.instr_errors.get(names.COMPONENT_WEIGHTS)
