"""MooncakeInstrumentor: plain mooncake.store code measured with no code change, on a real
master on loopback; exact counts and bytes; dpobs's own adapters not counted twice; the
originals back after uninstrument; DPOBS_AUTO=1 in a script that never mentions dpobs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import scrape, value
from prometheus_client.parser import text_string_to_metric_families
from tensordict import TensorDict

from helpers.mooncake import BYTES, KEYS, OPS, MooncakeDataPlane

from mooncake.store import MooncakeDistributedStore as Store

import dpobs_otel as dpobs
from dpobs_otel.adapters.mooncake import MooncakeInstrumentor, instrument_store
from dpobs_otel.adapters.mooncake.store import MEASURED
from dpobs_otel.testing.processes import free_port


@pytest.fixture
def instrumented(tel):
    inst = MooncakeInstrumentor()
    inst.instrument(telemetry=tel)
    yield inst
    inst.uninstrument()


def test_plain_store_calls_are_measured_exactly(tel, store, instrumented):
    a, b = torch.arange(10, dtype=torch.float32), torch.ones(4, 3, dtype=torch.bfloat16)
    assert store.put_tensor("inst-a", a) == 0
    assert store.batch_put_tensor(["inst-b", "inst-c"], [b, b]) == [0, 0]
    assert torch.equal(store.get_tensor("inst-a"), a)
    assert store.get_tensor("inst-missing") is None
    store.batch_remove(["inst-b", "inst-c"])
    s = scrape(tel)
    assert value(s, OPS, op="put") == 2 and value(s, KEYS, op="put") == 3
    assert value(s, BYTES, op="put", direction="write") == a.nbytes + 2 * b.nbytes
    assert value(s, OPS, op="get") == 2 and value(s, BYTES, op="get", direction="read") == \
        a.nbytes
    assert value(s, "dpobs_client_rows_missing_total", op="get") == 1
    assert value(s, OPS, op="clear") == 1


def test_dpobs_own_mooncake_adapter_is_not_counted_twice(tel, store, master, instrumented):
    plane = MooncakeDataPlane(store, namespace="inst", lease_s=master.lease_s)
    try:
        client = tel.instrument(plane)
        td = TensorDict({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3])
        client.put_samples(["r0", "r1", "r2"], "p", td)
        client.get_samples(["r0", "r1"], "p", ["x"])
        s = scrape(tel)
        # One put and one get through the protocol; the store calls the plane makes inside
        # them are the plane's, not the instrumentor's.
        assert value(s, OPS, op="put") == 1 and value(s, KEYS, op="put") == 3
        assert value(s, OPS, op="get") == 1 and value(s, KEYS, op="get") == 2
    finally:
        plane.close()


def test_the_plane_s_deferred_removals_are_its_own_on_their_thread(tel, store, master,
                                                                 instrumented):
    # A clear that meets a read's lease leaves the keys to a removal thread: its
    # batch_remove calls are the plane's clear, not another one.
    plane = MooncakeDataPlane(store, namespace="inst-lease", lease_s=master.lease_s)
    try:
        client = tel.instrument(plane)
        client.put_samples(["r0", "r1"], "p", TensorDict({"x": torch.ones(2, 2)}, [2]))
        client.get_samples(["r0", "r1"], "p")  # leases every key it read
        client.clear_samples(["r0", "r1"], "p")
        assert plane.flush_clears(30) and plane._deferred.removed > 0
        s = scrape(tel)
    finally:
        plane.close()
    assert value(s, OPS, op="clear") == 1 and value(s, KEYS, op="clear") == 2


def test_instrument_store_under_the_instrumentor_counts_each_call_once(tel, store,
                                                                       instrumented):
    explicit = dpobs.start(role="explicit", rank=0, port=0)
    try:
        raw = instrument_store(explicit, store)
        t = torch.arange(4, dtype=torch.float32)
        assert raw.put_tensor("once-a", t) == 0
        assert torch.equal(raw.get_tensor("once-a"), t)
        s_explicit, s_patched = scrape(explicit), scrape(tel)
        store.remove("once-a")  # a plain call: the instrumentor's
        s_after = scrape(tel)
    finally:
        explicit.shutdown()
    assert value(s_explicit, OPS, op="put") == 1 and value(s_explicit, OPS, op="get") == 1
    assert value(s_patched, OPS, op="put") is None and value(s_patched, OPS, op="get") is None
    assert value(s_after, OPS, op="clear") == 1


def test_uninstrument_restores_the_class_and_instrument_is_idempotent(tel):
    own = {m: getattr(Store, m) for m in MEASURED if hasattr(Store, m)}
    assert {"put_tensor", "get_tensor", "batch_put_tensor", "remove"} <= set(own)
    inst = MooncakeInstrumentor()
    assert MooncakeInstrumentor() is inst
    inst.instrument(telemetry=tel)
    inst.instrument(telemetry=tel)
    assert all(getattr(Store, m).__wrapped__ is fn for m, fn in own.items())
    inst.uninstrument()
    inst.uninstrument()
    assert {m: getattr(Store, m) for m in own} == own


SCRIPT = """
import json, os, sys, urllib.request
import torch
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", os.environ["T_META"], 16 << 20, 16 << 20, "tcp", "",
                   os.environ["T_RPC"]) == 0
assert store.put_tensor("auto-a", torch.arange(8, dtype=torch.int64)) == 0
assert store.get_tensor("auto-a").tolist() == list(range(8))
url = "http://127.0.0.1:" + os.environ["DPOBS_PORT"] + "/metrics"
print(json.dumps(urllib.request.urlopen(url, timeout=10).read().decode()))
store.remove("auto-a")
store.close()
"""


@pytest.mark.parametrize("switch", ["DPOBS_AUTO", "opentelemetry-instrument"])
def test_a_script_that_never_mentions_dpobs_is_measured(master, switch):
    assert "dpobs" not in SCRIPT
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    env.update(DPOBS_ROLE="rollout", DPOBS_PORT=str(free_port()), DPOBS_HOST="127.0.0.1",
               MC_TCP_BIND_ADDRESS="127.0.0.1", T_META=master.metadata_url,
               T_RPC=master.rpc_address, OTEL_METRICS_EXPORTER="none",
               OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    cmd = [sys.executable, "-c", textwrap.dedent(SCRIPT)]
    if switch == "DPOBS_AUTO":
        env["DPOBS_AUTO"] = "1"
    else:  # the launcher activates every installed instrumentor, this one among them
        cmd.insert(0, os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument"))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    text = json.loads(out.stdout.strip().splitlines()[-1])
    samples = {(smp.name, smp.labels.get("op"), smp.labels.get("direction")): smp.value
               for fam in text_string_to_metric_families(text) for smp in fam.samples
               if smp.labels.get("dpobs_role", "rollout") == "rollout"}
    assert samples[(OPS, "put", None)] == 1 and samples[(OPS, "get", None)] == 1
    assert samples[(BYTES, "put", "write")] == samples[(BYTES, "get", "read")] == 8 * 8
