"""One row of the switch matrix (tests/test_switch_matrix.py), run as `main()` in a fresh
interpreter under the row's launcher and environment: every client kind in turn, against
the TransferQueue (on Ray) and Mooncake master the test started, then one JSON line:

    results   kind -> what the program got back (must equal the plain row's)
    counts    kind -> {op: calls} dpobs counted during that kind (from its own /metrics)
    modules   every module imported by the end, before anything reads /metrics
    listening how many TCP sockets this process listens on
    written   the files in DPOBS_SD_DIR before the process ends

M_ROW (the row's name, a key prefix), M_RAY, M_RPC, M_META (the shared backends) and
M_IN_CODE=1 (the program starts dpobs itself, as the README shows) come from the
environment; everything else is the row's launcher and switches. Nothing here names dpobs
outside the in-code setup and the scrape of an endpoint dpobs announced.
"""
from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import sys

IN_CODE = os.environ.get("M_IN_CODE") == "1"
ROW = os.environ["M_ROW"]
T = 60  # seconds: one call's limit


def _td(i: int):
    import torch
    from tensordict import TensorDict

    return TensorDict({"x": torch.arange(6).reshape(3, 2) + 10 * i}, batch_size=[3])


def _rows(td) -> list:
    return sorted(r.tolist() for r in td["x"].unbind())


# -- the kinds: each returns what the program saw ------------------------------------
def tq_kv(tq, p):
    keys = [f"k{k}" for k in range(3)]  # the partition is the row's own
    tq.kv_batch_put(keys=keys, partition_id=p, fields=_td(1))
    got = tq.kv_batch_get(keys=keys, partition_id=p)
    listed = sorted(tq.kv_list(partition_id=p)[p])
    tq.kv_clear(keys=keys, partition_id=p)
    return [_rows(got), listed]


async def tq_kv_async(tq, p):
    keys = [f"k{k}" for k in range(3)]  # the partition is the row's own
    await tq.async_kv_batch_put(keys=keys, partition_id=p, fields=_td(2))
    got = await tq.async_kv_batch_get(keys=keys, partition_id=p)
    listed = sorted((await tq.async_kv_list(partition_id=p))[p])
    await tq.async_kv_clear(keys=keys, partition_id=p)
    return [_rows(got), listed]


def tq_client(tq, p):
    client = tq.get_client()
    client.put(_td(3), partition_id=p)
    meta = client.get_meta(data_fields=["x"], batch_size=3, partition_id=p, mode="fetch",
                           task_name="m")
    got = client.get_data(meta)
    client.clear_partition(p)
    return _rows(got)


async def tq_client_async(tq, p):
    client = tq.get_client()
    await client.async_put(_td(4), partition_id=p)
    meta = await client.async_get_meta(data_fields=["x"], batch_size=3, partition_id=p,
                                       mode="fetch", task_name="m")
    got = await client.async_get_data(meta)
    await client.async_clear_partition(p)
    return _rows(got)


def mooncake_store(store, p):
    import torch

    store.put_tensor(f"{p}-t", torch.arange(4) + 5)
    got = store.get_tensor(f"{p}-t").tolist()
    return [got, store.remove(f"{p}-t")]


def plane(dp, p):
    ids = [f"{p}-{k}" for k in range(3)]
    dp.put_samples(ids, p, _td(5))
    got = dp.get_samples(ids, p, ["x"])
    listed = sorted(dp.list_sample_ids(p))
    dp.clear_samples(ids, p)
    return [_rows(got), listed]


async def plane_async(dp, p):
    ids = [f"{p}-{k}" for k in range(3)]
    await dp.put_samples(ids, p, _td(6))
    got = await dp.get_samples(ids, p, ["x"])
    listed = sorted(await dp.list_sample_ids(p))
    await dp.clear_samples(ids, p)
    return [_rows(got), listed]


# -- the program ----------------------------------------------------------------------
def _backends() -> dict:
    """What the program calls: transfer_queue, a Mooncake store, the data planes (sync and
    async), and the telemetry (None): bare, or wrapped as the README's in-code setup."""
    import transfer_queue
    from helpers.aplane import AsyncPlane

    from dpobs_otel.adapters.mooncake import MooncakeDataPlane
    from dpobs_otel.stores.memory import InMemoryDataPlane
    from dpobs_otel.testing.mooncake import connect_store
    from dpobs_otel.testing.transferqueue import attach

    attach(os.environ["M_RAY"])
    store = connect_store(os.environ["M_RPC"], os.environ["M_META"])
    memory, mp = InMemoryDataPlane(), MooncakeDataPlane(store, namespace=ROW)
    planes = {"memory": memory, "memory_async": AsyncPlane(memory), "mooncake_plane": mp,
              "mooncake_plane_async": AsyncPlane(mp)}
    if not IN_CODE:
        return {"tq": transfer_queue, "store": store, "raw_store": store, **planes, "tel": None}
    import dpobs_otel as dpobs
    from dpobs_otel.adapters import transferqueue
    from dpobs_otel.adapters.mooncake import instrument_store

    tel = dpobs.start(role="matrix", rank=0)
    transferqueue.TransferQueueInstrumentor().instrument(telemetry=tel)  # client classes
    return {"tq": transferqueue.instrument(tel), "store": instrument_store(tel, store),
            "raw_store": store, **{k: tel.instrument(v) for k, v in planes.items()},
            "tel": tel}


def _endpoint(tel):
    if tel is not None:
        return tel.endpoint
    for path in glob.glob(os.path.join(os.environ["DPOBS_SD_DIR"], "*.json")):
        from dpobs_otel.names import STORE_ROLES  # here: a file means dpobs is on
        with open(path) as f:
            group = json.load(f)[0]
        if group["labels"].get("role") not in STORE_ROLES:  # not the Ray node beside it
            return group["targets"][0]
    return None


def _counts(endpoint) -> dict:
    """op -> calls, from the endpoint dpobs serves (nothing read when it serves none)."""
    if endpoint is None:
        return {}
    import urllib.request

    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    # The data plane's ops. Once Ray's ops share the family, the exporter writes their
    # `method` label on every series (empty on these); TransferQueue's own Ray calls are
    # measured as Ray's ops (tests/adapters/ray holds those), not counted here.
    return {op: float(n) for op, n in re.findall(
        r'^dpobs_client_operation_duration_seconds_count\{(?:method="",)?op="([^"]+)"\} (\S+)$',
        text, re.M) if not op.startswith("ray_")}


def listening() -> int:
    """TCP sockets this process listens on (state 0A in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            n += sum(1 for line in list(f)[1:]
                     if line.split()[3] == "0A" and line.split()[9] in inodes)
    return n


def main() -> None:
    from dpobs_otel.testing.transferqueue import call, detach

    b = _backends()
    tel = b["tel"]
    kinds = {"tq_kv": lambda: tq_kv(b["tq"], f"{ROW}kv"),
             "tq_kv_async": lambda: asyncio.run(tq_kv_async(b["tq"], f"{ROW}akv")),
             "tq_client": lambda: tq_client(b["tq"], f"{ROW}cl"),
             "tq_client_async": lambda: asyncio.run(tq_client_async(b["tq"], f"{ROW}acl")),
             "mooncake_store": lambda: mooncake_store(b["store"], f"{ROW}ms"),
             "memory": lambda: plane(b["memory"], "mem"),
             "memory_async": lambda: asyncio.run(plane_async(b["memory_async"], "amem")),
             "mooncake_plane": lambda: plane(b["mooncake_plane"], "mp"),
             "mooncake_plane_async": lambda: asyncio.run(plane_async(
                 b["mooncake_plane_async"], "amp"))}
    out = {"results": {}, "counts": {}}
    before = _counts(_endpoint(tel))
    for kind, run in kinds.items():
        out["results"][kind] = call(run, timeout_s=T)
        after = _counts(_endpoint(tel))
        out["counts"][kind] = {op: n - before.get(op, 0) for op, n in after.items()
                               if n != before.get(op, 0)}
        before = after
    out["modules"] = sorted(sys.modules)
    out["listening"] = listening()
    out["written"] = sorted(os.listdir(os.environ["DPOBS_SD_DIR"]))  # before exit removes it
    b["raw_store"].close()
    detach()
    print(json.dumps(out), flush=True)
