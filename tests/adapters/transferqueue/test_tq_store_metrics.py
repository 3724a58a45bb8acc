"""TransferQueue's own exporter beside dpobs's, live: TransferQueue on a local Ray at
127.0.0.1, started by the loopback launcher under TransferQueueInstrumentor with
DPOBS_TQ_METRICS=1, so dpobs turned the exporter on. The controller's endpoint is announced
once however many processes see it; every call of requests.TABLE moves the store's own
request counters (scraped from its endpoint) by exactly the table's amounts, dpobs's guard
and reconciliation listings included; and with every client measured, the requests dpobs's
op counts map to are the requests the store served: coverage 1.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import types
from collections import Counter

import pytest
import torch
import transfer_queue as tq
from helpers import scrape
from helpers.transferqueue import OPS, RELEASE, SHORT_READS, T
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.adapters.instrumentation import own
from dpobs_otel.adapters.transferqueue import TransferQueueInstrumentor
from dpobs_otel.adapters.transferqueue import instrument as tq_instrument
from dpobs_otel.adapters.transferqueue.client import ClientPatches
from dpobs_otel.adapters.transferqueue.exporter import (COLLECT_INTERVAL_ENV,
                                                        CONTROLLER_REQUESTS, CONTROLLER_UPTIME,
                                                        FIRST_RELEASE, OP_TYPE,
                                                        STORAGE_REQUESTS)
from dpobs_otel.adapters.transferqueue.kv import TransferQueueDataPlane
from dpobs_otel.adapters.transferqueue.requests import expected, per_op
from dpobs_otel.adapters.transferqueue.store_metrics import ROLE
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV, call, start, stop

pytestmark = pytest.mark.skipif(RELEASE < FIRST_RELEASE, reason="no exporter before 0.1.7")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
ENV = {"DPOBS_TQ_METRICS": "1", COLLECT_INTERVAL_ENV: "1"}  # the collection: every second
SETTLE_S = 30  # the longest two collections may take on a loaded machine


class Store:
    """TransferQueue's exporter read as (controller, storage) request counts by op_type."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def counts(self) -> tuple[Counter, Counter]:
        """After two collections have started: the storage counts then hold every request
        served before the call (the controller's are counted as each is served)."""
        seen = {self._uptime()}
        deadline = time.monotonic() + SETTLE_S
        while len(seen) < 3:
            assert time.monotonic() < deadline, "TransferQueue's collection stalled"
            time.sleep(0.2)
            seen.add(self._uptime())
        controller, storage = Counter(), Counter()
        for (name, labels), v in scrape(self).items():
            if name in (CONTROLLER_REQUESTS, STORAGE_REQUESTS):
                kind = dict(labels)[OP_TYPE]
                (controller if name == CONTROLLER_REQUESTS else storage)[kind] += int(v)
        return controller, storage

    def _uptime(self) -> float:
        return next(v for (name, _), v in scrape(self).items() if name == CONTROLLER_UPTIME)


def _moved(after: tuple, before: tuple) -> tuple[Counter, Counter]:
    return tuple(Counter({k: n - b[k] for k, n in a.items() if n != b[k]})
                 for a, b in zip(after, before))


def _mapped(calls: dict) -> tuple[Counter, Counter]:
    return tuple(+c for c in expected(calls))  # the table's amounts, zeros left out


def _td(n: int, field: str = "x") -> TensorDict:
    return TensorDict({field: torch.arange(3 * n).reshape(n, 3)}, batch_size=[n])


def _controller_files(sd_dir) -> list[str]:
    return sorted(glob.glob(os.path.join(sd_dir, "tq-controller-*.json")))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    sd = tmp_path_factory.mktemp("sd")
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)  # before Ray starts: its workers (the controller) inherit them
    tel = dpobs.start(role="test", rank=0, port=0, sd_dir=str(sd), verify_tensor_hash=True)
    spare = dpobs.start(role="reconciling", rank=0, port=0, reconcile_rows=2)
    inst = TransferQueueInstrumentor()
    inst.instrument(telemetry=tel)
    try:
        handle = start()  # the launcher's tq.init, measured: the exporter on
        (path,) = _controller_files(sd)
        with open(path) as f:
            (group,) = json.load(f)
        store = Store(group["targets"][0])
        # The first request each loop serves after the exporter starts is counted nowhere
        # (exporter.py): one put and clear, unmeasured, are those.
        call(own(tq.kv_batch_put), keys=["prime"], partition_id="prime", fields=_td(1), timeout_s=T)
        call(own(tq.kv_clear), keys=["prime"], partition_id="prime", timeout_s=T)
        yield types.SimpleNamespace(handle=handle, tel=tel, spare=spare, sd=sd, store=store,
                                    group=group, state={})
    finally:
        try:
            stop()  # the measured close: the controller's file goes with it
            assert _controller_files(sd) == []
        finally:
            inst.uninstrument()
            tel.shutdown()
            spare.shutdown()
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


# -- discovery ---------------------------------------------------------------------------------
def test_the_controllers_endpoint_is_announced_for_file_sd(live):
    assert live.group == {"targets": [call(tq.get_metrics_endpoint, timeout_s=T)],
                          "labels": {"job": live.tel.settings.job, "role": ROLE}}
    assert live.store.endpoint.startswith("127.0.0.1:")  # the controller's node IP: loopback
    assert live.store.counts()  # TransferQueue's own /metrics, served there


CHILD = """
import json, os, sys
from dpobs_otel.testing.transferqueue import attach, detach
attach(sys.argv[1])  # tq.init under DPOBS_AUTO: joins the controller, finds the exporter on
print(json.dumps(sorted(os.listdir(os.environ["DPOBS_SD_DIR"]))), flush=True)
detach()
"""


def test_every_process_that_sees_it_announces_the_same_one_target(live):
    (path,) = _controller_files(live.sd)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
    env.update(LOOPBACK_ENV, DPOBS_AUTO="1", DPOBS_SD_DIR=str(live.sd), DPOBS_ROLE="rollout",
               DPOBS_HOST="127.0.0.1", DPOBS_PORT="0", OTEL_METRICS_EXPORTER="none",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")])))
    child = subprocess.run([sys.executable, "-c", CHILD, live.handle.ray_address], env=env,
                           capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert [e for e in seen if e.startswith("tq-controller-")] == [os.path.basename(path)]
    assert any(e.startswith("dpobs-dpobs-rollout-") for e in seen)  # the child was measured
    assert _controller_files(live.sd) == [path]  # the child's exit left the announcement


# -- one call of each kind: the store's counters move by the table's amounts -----------------
def _client():
    return tq.get_client()


def _kv_plane(live, tel=None):
    return (tel or live.tel).instrument(TransferQueueDataPlane())


def _with_patches(tel, fn):
    """fn() with the client classes measured into tel (over the instrumentor's patches)."""
    patches = ClientPatches(lambda: tel)
    patches.install()
    try:
        return fn()
    finally:
        patches.uninstall()


K = ["k0", "k1", "k2", "k3"]
# (name, the calls of requests.TABLE it makes, setup (unmeasured, before the count), act)
WALK = [
    ("kv.put", {"kv.put": 1}, None,
     lambda v: call(tq.kv_batch_put, keys=K, partition_id="walk", fields=_td(4), timeout_s=T)),
    ("kv.get", {"kv.get": 1}, None,
     lambda v: call(tq.kv_batch_get, keys=K, partition_id="walk", timeout_s=T)),
    ("kv.get:short", {"kv.get:short" if SHORT_READS else "kv.get:absent": 1}, None,
     lambda v: _maybe_raises(tq.kv_batch_get, keys=["k0", "nobody"], partition_id="walk")),
    ("kv.get:absent", {"kv.get:absent": 1}, None,
     lambda v: _maybe_raises(tq.kv_batch_get, keys=["nobody"], partition_id="walk")),
    ("kv.list", {"kv.list": 1}, None, lambda v: call(tq.kv_list, "walk", timeout_s=T)),
    ("kv.put:tags", {"kv.put:tags": 1}, None,
     lambda v: call(tq.kv_batch_put, keys=K[:1], partition_id="walk", tags=[{"t": 1}],
                    timeout_s=T)),
    ("kv.clear", {"kv.clear": 1}, None,
     lambda v: call(tq.kv_clear, keys=K, partition_id="walk", timeout_s=T)),
    ("kv.clear:absent", {"kv.clear:absent": 1}, None,
     lambda v: call(tq.kv_clear, keys=["nobody"], partition_id="walk", timeout_s=T)),
    ("kv.clear:partition", {"kv.clear:partition": 1},
     lambda v: call(own(tq.kv_batch_put), keys=K[:2], partition_id="whole", fields=_td(2),
                    timeout_s=T),
     lambda v: call(_kv_plane(v).clear_samples, None, "whole", timeout_s=T)),
    ("kv.register", {"kv.register": 1}, None,
     lambda v: _kv_plane(v).register_partition("registered")),
    ("kv.reconcile", {"kv.put": 1, "kv.reconcile": 1}, None,  # reconcile_rows=2: after the put
     lambda v: call(_kv_plane(v, v.spare).put_samples, ["r0", "r1"], "rec", _td(2),
                    timeout_s=T)),
    ("client.put:insert", {"client.put:insert": 1}, None,
     lambda v: call(_client().put, _td(2, "y"), partition_id="cw", timeout_s=T)),
    ("client.claim_meta", {"client.claim_meta": 1}, None,
     lambda v: v.state.update(meta=call(_client().get_meta, data_fields=["y"], batch_size=2,
                                        partition_id="cw", mode="fetch", task_name="walk",
                                        timeout_s=T))),
    ("client.get_data", {"client.get_data": 1}, None,
     lambda v: call(_client().get_data, v.state["meta"], timeout_s=T)),
    ("client.put", {"client.put": 1}, None,  # a new field into the claimed rows
     lambda v: call(_client().put, _td(2, "r"), v.state["meta"], timeout_s=T)),
    ("client.clear", {"client.clear": 1}, None,
     lambda v: call(_client().clear_samples, v.state["meta"], timeout_s=T)),
    ("client.clear:partition", {"client.clear:partition": 1},
     lambda v: call(_client().put, _td(2, "y"), partition_id="cw2", timeout_s=T),
     lambda v: call(_client().clear_partition, "cw2", timeout_s=T)),
    ("client.clear:other_partition", {"client.clear:other_partition": 1},
     lambda v: call(own(_client().put), _td(2, "y"), partition_id="cw3", timeout_s=T),
     lambda v: call(_client().clear_partition, "cw3", timeout_s=T)),
    ("client.reconcile", {"client.put:insert": 1, "client.reconcile": 1,
                          "client.reconcile:partition": 1}, None,
     lambda v: _with_patches(v.spare, lambda: call(_client().put, _td(2, "y"),
                                                    partition_id="rc", timeout_s=T))),
]


def _maybe_raises(fn, **kwargs):
    try:
        call(fn, timeout_s=T, **kwargs)
    except ValueError:  # "keys or partition were not found!": TransferQueue's own answer
        pass


@pytest.fixture(scope="module")
def walked(live):
    """name -> (what the store's counters moved by, what the table says), one call each."""
    out, before = {}, None
    for name, calls, setup, act in WALK:
        if setup is not None:
            setup(live)
            before = None
        if before is None:
            before = live.store.counts()
        act(live)
        after = live.store.counts()
        out[name] = (_moved(after, before), _mapped(calls))
        before = after
    return out


@pytest.mark.parametrize("name", [w[0] for w in WALK])
def test_one_call_moves_the_stores_counters_by_the_mapped_amounts(walked, name):
    (controller, storage), (want_controller, want_storage) = walked[name]
    assert (dict(controller), dict(storage)) == (dict(want_controller), dict(want_storage))


# -- coverage 1 -----------------------------------------------------------------------------
def _op_counts(tel) -> Counter:
    return Counter({dict(labels)["op"]: int(v) for (name, labels), v in scrape(tel).items()
                    if name == OPS})


def _made(ops: Counter, api: str) -> tuple[Counter, Counter]:
    """The requests dpobs's op counts map to (per_op: the weights of the api's plain form)."""
    weights = per_op(api)
    return expected({f"{api}.{op}": n for op, n in ops.items() if op in weights})


def test_with_every_client_measured_the_requests_made_are_the_requests_served(live):
    """A GRPO-shaped loop through both APIs: a rollout puts a step's rows, two trainers read
    a half each, the rows are listed and cleared (kv, its own Telemetry, guard off); a
    producer claims insert metadata, puts, a consumer claims, reads, clears (client API,
    the instrumentor's Telemetry, guard on)."""
    kv_tel = dpobs.start(role="coverage", rank=0, port=0)
    try:
        kv, client = tq_instrument(kv_tel), _client()
        before, client_ops = live.store.counts(), _op_counts(live.tel)
        for step in range(3):
            keys, pid = [f"s{i}" for i in range(8)], f"step{step}"
            call(kv.kv_batch_put, keys=keys, partition_id=pid, fields=_td(8), timeout_s=T)
            for half in (keys[:4], keys[4:]):
                call(kv.kv_batch_get, keys=half, partition_id=pid, timeout_s=T)
            call(kv.kv_list, pid, timeout_s=T)
            call(kv.kv_clear, keys=keys, partition_id=pid, timeout_s=T)
            meta = call(client.get_meta, data_fields=["y"], batch_size=4,
                        partition_id="c" + pid, mode="insert", timeout_s=T)
            call(client.put, _td(4, "y"), meta, timeout_s=T)
            meta = call(client.get_meta, data_fields=["y"], batch_size=4,
                        partition_id="c" + pid, mode="fetch", task_name="train", timeout_s=T)
            call(client.get_data, meta, timeout_s=T)
            call(client.clear_samples, meta, timeout_s=T)
        served = _moved(live.store.counts(), before)
        kv_made = _made(_op_counts(kv_tel), "kv")
        client_made = _made(_op_counts(live.tel) - client_ops, "client")
    finally:
        kv_tel.shutdown()
    made = tuple(a + b for a, b in zip(kv_made, client_made))
    assert (dict(made[0]), dict(made[1])) == (dict(served[0]), dict(served[1]))
    coverage = (sum(made[0].values()) + sum(made[1].values())) / (
        sum(served[0].values()) + sum(served[1].values()))
    assert coverage == 1.0 and served[0] and served[1]
