"""Zero code changes: TransferQueueInstrumentor patches `transfer_queue` in place, in this
process, under `opentelemetry-instrument`, and in a Ray actor configured by environment
variables alone. Every number is read from a real /metrics endpoint and compared with the
bytes and counts of what the plain TransferQueue code did.
"""
from __future__ import annotations

import asyncio
import glob
import inspect
import json
import os
import subprocess
import sys
import threading
import types

import opentelemetry.instrumentation.auto_instrumentation as otel_auto
import pytest
import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.adapters.transferqueue import KV_FUNCTIONS, TransferQueueInstrumentor
from dpobs_otel.shims.otel_sdk import degradations
from dpobs_otel.adapters.transferqueue.client import ASYNC_METHODS, SYNC_METHODS
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV, RAY_NAMESPACE, call
from helpers import rollout_actor, scrape, value
from helpers.transferqueue import BYTES, KEYS, OPS, T

# The Ray worker imports the actor as helpers.rollout_actor, from the tests folder.
TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def instrumentor():
    inst = TransferQueueInstrumentor()
    try:
        yield inst
    finally:
        inst.uninstrument()


def _client_methods() -> dict:
    from transfer_queue.client import AsyncTransferQueueClient, TransferQueueClient

    return {**{m: vars(TransferQueueClient)[m] for m in SYNC_METHODS},
            **{m: vars(AsyncTransferQueueClient)[m] for m in ASYNC_METHODS}}


def test_instrument_is_idempotent_thread_safe_and_undone(instrumentor):
    originals = {name: getattr(tq, name) for name in KV_FUNCTIONS}
    methods = _client_methods()
    assert TransferQueueInstrumentor() is instrumentor  # one per process
    threads = [threading.Thread(target=instrumentor.instrument) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, fn in originals.items():
        patched = getattr(tq, name)
        assert patched is not fn and patched.__wrapped__ is fn, name  # wrapped exactly once
        assert inspect.iscoroutinefunction(patched) == inspect.iscoroutinefunction(fn), name
    for name, fn in _client_methods().items():
        assert fn is not methods[name] and fn.__wrapped__ is methods[name], name
    instrumentor.uninstrument()
    instrumentor.uninstrument()  # a second one is a no-op
    assert {name: getattr(tq, name) for name in KV_FUNCTIONS} == originals
    assert _client_methods() == methods


def test_plain_transfer_queue_calls_measured_in_process(cluster, instrumentor, monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True)
    try:
        instrumentor.instrument(telemetry=tel)
        td = TensorDict({"x": torch.arange(12).reshape(4, 3)}, batch_size=[4])
        ids = ["i0", "i1", "i2", "i3"]
        call(tq.kv_batch_put, keys=ids, partition_id="inproc", fields=td, timeout_s=T)
        got = call(tq.kv_batch_get, keys=ids, partition_id="inproc", timeout_s=T)
        got2 = call(asyncio.run, tq.async_kv_batch_get(keys=ids[:2], partition_id="inproc",
                                                        select_fields="x"), timeout_s=T)
        with pytest.raises(ValueError):
            call(tq.kv_batch_get, keys=["nobody"], partition_id="inproc", timeout_s=T)
        call(tq.kv_clear, keys=ids, partition_id="inproc", timeout_s=T)
        s = scrape(tel)
    finally:
        tel.shutdown()
    assert [r.tolist() for r in got["x"].unbind()] == td["x"].tolist()
    assert got2["x"].unbind()[1].tolist() == [3, 4, 5]
    assert value(s, OPS, op="put") == 1 and value(s, KEYS, op="put") == 4
    assert value(s, BYTES, op="put", direction="write") == 12 * 8
    assert value(s, OPS, op="get") == 3 and value(s, KEYS, op="get") == 4 + 2  # not the refused
    assert value(s, BYTES, op="get", direction="read") == 12 * 8 + 6 * 8
    assert value(s, "dpobs_client_operation_errors_total", op="get", error_type="ValueError") == 1
    assert value(s, OPS, op="clear") == 1
    assert value(s, "dpobs_guard_rows_checked_total", field="x") == 4 + 2
    assert value(s, "dpobs_guard_rows_mismatched_total", field="x") == 0


def _endpoint(sd_dir) -> types.SimpleNamespace:
    """The one /metrics endpoint a process registered in sd_dir (file_sd); not the stores'
    own exporters beside it (the Ray node a measured Ray driver announces)."""
    groups = []
    for path in glob.glob(os.path.join(sd_dir, "*.json")):
        with open(path) as f:
            groups += [g for g in json.load(f) if g["labels"].get("role") not in names.STORE_ROLES]
    assert len(groups) == 1, groups
    (group,) = groups
    (target,) = group["targets"]
    return types.SimpleNamespace(endpoint=target, labels=group["labels"])


def _zero_code_env(tmp_path, role: str) -> dict:
    return {**LOOPBACK_ENV, "DPOBS_ROLE": role, "DPOBS_RANK": "3",
            "DPOBS_SD_DIR": str(tmp_path), "DPOBS_VERIFY_TENSOR_HASH": "1"}


_SCRIPT = """
import sys
import ray
import torch
import transfer_queue as tq
import transfer_queue.interface as tqi
from tensordict import TensorDict

# Join the test's Ray cluster; tq.init() finds its controller and builds a client only.
ray.init(address={address!r}, _node_ip_address="127.0.0.1", log_to_driver=False,
         namespace={namespace!r})
tq.init()
try:
    keys = ["s0", "s1", "s2", "s3"]
    tq.kv_batch_put(keys=keys, partition_id="launcher",
                    fields=TensorDict({{"x": torch.arange(12).reshape(4, 3)}}, batch_size=[4]))
    tq.kv_batch_get(keys=keys, partition_id="launcher")
    print("done", flush=True)
    sys.stdin.readline()
    tq.kv_clear(keys=keys, partition_id="launcher")
finally:
    # Close this client only: tq.close() would kill the controller the test owns.
    prefix = "_TQ_" if hasattr(tqi, "_TQ_CLIENT") else "_TRANSFER_QUEUE_"  # 0.1.6's names
    client = getattr(tqi, prefix + "CLIENT")
    setattr(tqi, prefix + "CLIENT", None)
    setattr(tqi, prefix + "CONTROLLER", None)
    client.close()
    ray.shutdown()
"""


def test_unmodified_script_under_opentelemetry_instrument(cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(address=cluster.ray_address, namespace=RAY_NAMESPACE))
    assert "dpobs" not in script.read_text()
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    launcher = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
    env = {**os.environ, **_zero_code_env(sd_dir, "launched")}
    proc = subprocess.Popen([launcher, sys.executable, str(script)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out = call(proc.stdout.readline, timeout_s=180)
        assert out.strip() == "done", proc.stderr.read()[-3000:] if proc.poll() else out
        at = _endpoint(sd_dir)
        s = scrape(at)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert at.labels["role"] == "launched" and at.labels["rank"] == "3"
    assert value(s, OPS, op="put") == 1 and value(s, KEYS, op="put") == 4
    assert value(s, BYTES, op="put", direction="write") == 12 * 8
    assert value(s, OPS, op="get") == 1 and value(s, BYTES, op="get", direction="read") == 96
    assert value(s, "dpobs_guard_rows_checked_total", field="x") == 4


@pytest.mark.parametrize("switch", ["opentelemetry", "DPOBS_AUTO"])
def test_ray_actor_measured_with_environment_variables_only(cluster, tmp_path, switch):
    assert "dpobs" not in inspect.getsource(rollout_actor)
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    # The whole switch, and dpobs's usual settings: either OpenTelemetry's
    # auto-instrumentation directory on PYTHONPATH (what opentelemetry-instrument sets), or
    # DPOBS_AUTO=1 (the dpobs-otel-auto.pth start-up hook the package installs).
    # The actor sees this process's PYTHONPATH after those (make compat puts a TransferQueue
    # release first on it).
    path = [TESTS, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env_vars = {**_zero_code_env(sd_dir, "rollout"), "PYTHONPATH": os.pathsep.join(path)}
    if switch == "opentelemetry":
        env_vars["PYTHONPATH"] = os.pathsep.join([os.path.dirname(otel_auto.__file__), *path])
    else:
        env_vars["DPOBS_AUTO"] = "1"
    actor = ray.remote(num_cpus=0)(rollout_actor.RolloutWorker).options(
        runtime_env={"env_vars": env_vars}).remote()
    try:
        rows = call(ray.get, actor.write_and_read.remote(5), timeout_s=180)
        assert rows == torch.arange(15).reshape(5, 3).tolist()
        s = scrape(_endpoint(sd_dir))
        call(ray.get, actor.close.remote(), timeout_s=T)
    finally:
        ray.kill(actor)
    assert value(s, OPS, op="put") == 1 and value(s, KEYS, op="put") == 5
    assert value(s, BYTES, op="put", direction="write") == 15 * 8
    assert value(s, OPS, op="get") == 1 and value(s, BYTES, op="get", direction="read") == 120
    assert value(s, "dpobs_guard_rows_checked_total", field="x") == 5
    assert value(s, "dpobs_guard_rows_mismatched_total", field="x") == 0
    call(tq.kv_clear, keys=[f"a{i}" for i in range(5)], partition_id="actor", timeout_s=T)


def test_client_classes_measured_sync_and_async(cluster, instrumentor):
    tel = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True, reconcile_rows=4)
    try:
        instrumentor.instrument(telemetry=tel)
        client = tq.get_client()
        td = TensorDict({"x": torch.arange(12).reshape(4, 3)}, batch_size=[4])
        meta = call(client.get_meta, data_fields=["x"], batch_size=4, partition_id="cls",
                    mode="insert", timeout_s=T)
        call(client.put, td, meta, timeout_s=T)  # 4 rows put: a reconciliation runs
        call(client.put, td, partition_id="cls", timeout_s=T)  # TransferQueue makes the meta
        fetched = call(client.get_meta, data_fields=["x"], batch_size=8, partition_id="cls",
                       mode="fetch", task_name="t", timeout_s=T)
        got = call(client.get_data, fetched, timeout_s=T)
        again = call(asyncio.run, client.async_get_data(fetched), timeout_s=T)
        # The kv_* functions use the client's async methods inside: one op each, not two.
        call(tq.kv_batch_put, keys=["k0", "k1"], partition_id="cls-kv", fields=td[:2],
             timeout_s=T)
        s1 = scrape(tel)
        call(client.clear_samples, fetched[:6], timeout_s=T)
        call(tq.kv_clear, keys=["k0", "k1"], partition_id="cls-kv", timeout_s=T)
        call(client.clear_partition, "cls", timeout_s=T)  # the last two rows
        s2 = scrape(tel)
    finally:
        tel.shutdown()
    assert [r.tolist() for r in got["x"].unbind()] == td["x"].tolist() * 2
    assert [r.tolist() for r in again["x"].unbind()] == td["x"].tolist() * 2
    assert "custom_meta" not in str(got.keys())
    assert value(s1, OPS, op="claim_meta") == 2
    assert value(s1, OPS, op="put") == 2 + 1 and value(s1, KEYS, op="put") == 8 + 2
    assert value(s1, BYTES, op="put", direction="write") == 2 * 96 + 48
    assert value(s1, OPS, op="get_data") == 2 and value(s1, KEYS, op="get_data") == 16
    assert value(s1, BYTES, op="get_data", direction="read") == 2 * 192
    assert value(s1, "dpobs_guard_rows_checked_total", field="x") == 16
    assert value(s1, "dpobs_guard_rows_mismatched_total", field="x") == 0
    assert value(s1, "dpobs_client_outstanding_keys") == 8 + 2
    assert value(s2, OPS, op="clear") == 3 and value(s2, KEYS, op="clear") == 6 + 2 + 2
    assert value(s2, "dpobs_client_outstanding_keys") == 0
    assert value(s2, "dpobs_client_outstanding_size_bytes") == 0
    # At the declared SDK floor the exporter's reader takes no registry= (shims/otel_sdk.py):
    # that degradation is counted once, by design, under its own component and nothing else.
    sdk_floor = ("dpobs_instrumentation_errors_total",
                 frozenset({("component", names.OTEL_SDK_COMPONENT)}))
    by_design = {sdk_floor} if degradations() else set()
    errors = [k for k in s2 if k[0].startswith(("dpobs_instrumentation_errors",
                                                "dpobs_client_operation_err",
                                                "dpobs_guard_failures")) and k not in by_design]
    assert errors == [], errors


def test_calls_transfer_queue_s_own_modules_make_for_the_user_are_measured_once(
        cluster, instrumentor):
    # Its streaming dataset claims and reads a batch with the client's get_meta and get_data:
    # time the trainer waits on the data plane, as much as if it had made the calls itself.
    from transfer_queue.dataloader.streaming_dataset import default_fetch_batch_fn

    tel = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True)
    try:
        instrumentor.instrument(telemetry=tel)
        client = tq.get_client()
        td = TensorDict({"x": torch.arange(12).reshape(4, 3)}, batch_size=[4])
        call(client.put, td, partition_id="sds", timeout_s=T)
        before = scrape(tel)
        batch, meta = call(default_fetch_batch_fn, client, ["x"], 4, "sds", "train", {}, 0,
                           timeout_s=T)
        s = scrape(tel)
        call(client.clear_partition, "sds", timeout_s=T)
    finally:
        tel.shutdown()
    assert [r.tolist() for r in batch["x"].unbind()] == td["x"].tolist()
    assert value(before, OPS, op="claim_meta") is None and value(before, OPS, op="put") == 1
    assert value(s, OPS, op="claim_meta") == 1
    assert value(s, OPS, op="get_data") == 1
    assert value(s, BYTES, op="get_data", direction="read") == 96
    assert value(s, "dpobs_guard_rows_checked_total", field="x") == 4
    assert value(s, OPS, op="put") == 1  # nothing else counted on the way


def test_async_calls_measured_once_across_executor_and_client_loop(cluster, instrumentor):
    # An awaited call runs its measured path on a worker thread (run_in_executor), which
    # submits TransferQueue's coroutine to its client loop: each inner client call must be
    # seen as dpobs's own there, or the guarded read's get_data and the put's lookup would
    # be counted a second time.
    tel = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True)
    td = TensorDict({"z": torch.arange(10).reshape(5, 2)}, batch_size=[5])
    keys = [f"z{i}" for i in range(5)]

    async def session(client):
        await tq.async_kv_batch_put(keys=keys, partition_id="akv", fields=td)
        got = await tq.async_kv_batch_get(keys=keys, partition_id="akv")
        await tq.async_kv_clear(keys=keys, partition_id="akv")
        await client.async_put(td, partition_id="acl")  # TransferQueue's lookup, then put
        return got

    try:
        instrumentor.instrument(telemetry=tel)
        got = call(asyncio.run, session(tq.get_client()), timeout_s=T)
        s = scrape(tel)
        call(tq.get_client().clear_partition, "acl", timeout_s=T)
    finally:
        tel.shutdown()
    assert [r.tolist() for r in got["z"].unbind()] == td["z"].tolist()
    assert value(s, OPS, op="put") == 2 and value(s, KEYS, op="put") == 10
    assert value(s, BYTES, op="put", direction="write") == 2 * 80
    assert value(s, OPS, op="get") == 1 and value(s, BYTES, op="get", direction="read") == 80
    assert value(s, OPS, op="clear") == 1
    assert value(s, OPS, op="get_data") is None and value(s, OPS, op="claim_meta") is None
    assert value(s, "dpobs_guard_rows_checked_total", field="z") == 5


def test_async_client_methods_measured_once_each(cluster, instrumentor):
    tel = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True)
    td = TensorDict({"y": torch.arange(8).reshape(4, 2)}, batch_size=[4])

    async def session(client):
        meta = await client.async_get_meta(data_fields=["y"], batch_size=4,
                                           partition_id="acls", mode="insert")
        await client.async_put(td, meta)
        fetched = await client.async_get_meta(data_fields=["y"], batch_size=4,
                                              partition_id="acls", mode="fetch", task_name="t")
        got = await client.async_get_data(fetched)
        await client.async_clear_samples(fetched)
        return got

    try:
        instrumentor.instrument(telemetry=tel)
        got = call(asyncio.run, session(tq.get_client()), timeout_s=T)
        s = scrape(tel)
    finally:
        tel.shutdown()
    assert [r.tolist() for r in got["y"].unbind()] == td["y"].tolist()
    assert value(s, OPS, op="claim_meta") == 2
    assert value(s, OPS, op="put") == 1 and value(s, BYTES, op="put", direction="write") == 64
    assert value(s, OPS, op="get_data") == 1
    assert value(s, BYTES, op="get_data", direction="read") == 64
    assert value(s, OPS, op="clear") == 1 and value(s, KEYS, op="clear") == 4
    assert value(s, "dpobs_guard_rows_checked_total", field="y") == 4
    assert value(s, "dpobs_guard_rows_mismatched_total", field="y") == 0
    assert value(s, "dpobs_client_outstanding_keys") == 0


def test_explicit_adapter_under_the_instrumentor_counts_each_call_once(cluster, instrumentor):
    from dpobs_otel.adapters import transferqueue

    outer = dpobs.start(role="launcher", rank=0, port=0)
    inner = dpobs.start(role="explicit", rank=0, port=0)
    try:
        instrumentor.instrument(telemetry=outer)  # as opentelemetry-instrument would
        q = transferqueue.instrument(inner)  # code written against the explicit adapter
        td = TensorDict({"x": torch.arange(6).reshape(2, 3)}, batch_size=[2])
        call(q.kv_batch_put, ["e0", "e1"], "explicit", td, timeout_s=T)
        call(q.kv_batch_get, ["e0", "e1"], "explicit", timeout_s=T)
        call(tq.kv_clear, keys=["e0", "e1"], partition_id="explicit", timeout_s=T)
        s_inner, s_outer = scrape(inner), scrape(outer)
    finally:
        inner.shutdown()
        outer.shutdown()
    assert value(s_inner, OPS, op="put") == 1 and value(s_inner, OPS, op="get") == 1
    assert value(s_outer, OPS, op="put") is None and value(s_outer, OPS, op="get") is None
    assert value(s_outer, OPS, op="clear") == 1  # the plain call is the instrumentor's


def test_instrumentor_works_without_opentelemetry_instrumentation():
    # DPOBS_AUTO=1 users may install dpobs-otel[transferqueue] alone: no launcher package.
    code = """
import sys
sys.modules["opentelemetry.instrumentation"] = None  # as if not installed
import transfer_queue
from dpobs_otel.adapters.transferqueue import KV_FUNCTIONS, TransferQueueInstrumentor
own = {n: getattr(transfer_queue, n) for n in KV_FUNCTIONS}
base = TransferQueueInstrumentor.__mro__[2]  # past instrumentation.Instrumentor
assert base.__module__ == "dpobs_otel.adapters.instrumentation", base  # the fallback
inst = TransferQueueInstrumentor()
assert TransferQueueInstrumentor() is inst
inst.instrument(); inst.instrument()
assert all(getattr(transfer_queue, n).__wrapped__ is f for n, f in own.items())
inst.uninstrument()
assert {n: getattr(transfer_queue, n) for n in KV_FUNCTIONS} == own
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _async_client_session(partition: str):
    """Every measured async client method once (what `opentelemetry-instrument` patches)."""
    td = TensorDict({"w": torch.arange(6).reshape(3, 2)}, batch_size=[3])

    async def session(client):
        meta = await client.async_get_meta(data_fields=["w"], batch_size=3,
                                           partition_id=partition, mode="insert")
        await client.async_put(td, meta)
        fetched = await client.async_get_meta(data_fields=["w"], batch_size=3,
                                              partition_id=partition, mode="fetch",
                                              task_name="t")
        got = await client.async_get_data(fetched)
        await client.async_clear_samples(fetched)
        await client.async_clear_partition(partition)
        return [r.tolist() for r in got["w"].unbind()]

    got = call(asyncio.run, session(tq.get_client()), timeout_s=T)
    return sorted(got) == td["w"].tolist()  # a fetch hands rows back in any order


@pytest.mark.parametrize("switch", ["DPOBS_DISABLED", "OTEL_SDK_DISABLED"])
@pytest.mark.parametrize("when", ["before instrument()", "before the first call"])
def test_the_off_switch_leaves_the_client_classes_transfer_queues_own(cluster, instrumentor,
                                                                      monkeypatch, switch, when):
    # Issue 31: off, the first call's dpobs.start() gave back a DisabledTelemetry and the
    # async path called a Telemetry-only method on the bare plane ('awaiting').
    methods = _client_methods()
    if when == "before instrument()":
        monkeypatch.setenv(switch, "true")
        instrumentor.instrument()
        assert _client_methods() == methods  # nothing patched at all
    else:
        instrumentor.instrument()
        monkeypatch.setenv(switch, "true")  # read where dpobs would start
    assert _async_client_session(f"off{len(switch)}{len(when)}")
