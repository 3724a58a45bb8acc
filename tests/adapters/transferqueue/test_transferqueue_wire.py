"""The guard on TransferQueue across processes: a writer process's digests, checked by a
reader process, and a row rewritten by a third, uninstrumented client caught and named.
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
import types

import transfer_queue as tq
from helpers import scrape, value
from tensordict import TensorDict
from helpers.transferqueue import T

from dpobs_otel.testing.transferqueue import call


# -- writer and reader in other processes ------------------------------------------------
N_WIRE = 8
PID_WIRE = "wire"

_WRITER = """
import json, sys, torch
from dpobs_otel.testing.transferqueue import attach, detach, call
import dpobs_otel as dpobs, dpobs_otel.adapters.transferqueue as dtq
from tensordict import TensorDict
attach({address!r})
tel = dpobs.start(role="writer", rank=0, port=0, verify_tensor_hash=True)
try:
    n, g = {n}, torch.Generator().manual_seed(7)
    td = TensorDict({{
        "dense": torch.randint(0, 50000, (n, 12), generator=g),
        "bf": torch.randn(n, 5, generator=g).bfloat16(),
        "mask": torch.rand(n, 9, generator=g) > 0.5,
        "img": torch.randn(n, 4, 2, generator=g),
        "one": torch.randint(0, 9, (n, 1), generator=g),
        "score": torch.randn(n, generator=g),
        "tok": torch.nested.nested_tensor(
            [torch.randint(0, 9, (k,), generator=g) for k in range(1, n + 1)],
            layout=torch.jagged),
    }}, batch_size=[n])
    q = dtq.instrument(tel)
    call(q.kv_batch_put, [f"w{{i}}" for i in range(n)], {pid!r}, td, timeout_s=60)
finally:
    tel.shutdown()
    detach()
print("written", flush=True)
"""

_READER = """
import json, sys
from dpobs_otel.testing.transferqueue import attach, detach, call
import dpobs_otel as dpobs, dpobs_otel.adapters.transferqueue as dtq
attach({address!r})
tel = dpobs.start(role="reader", rank=0, port=0, verify_tensor_hash=True)
try:
    q = dtq.instrument(tel)
    print(json.dumps({{"endpoint": tel.endpoint}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "read":
            break
        got = call(q.kv_batch_get, [f"w{{i}}" for i in range({n})], {pid!r}, timeout_s=60)
        print(json.dumps({{"rows": got.batch_size[0], "fields": sorted(got.keys())}}), flush=True)
finally:
    tel.shutdown()
    detach()
"""


def _readline(proc, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no answer from pid {proc.pid} within {timeout_s}s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"pid {proc.pid} exited (rc={proc.wait(10)}): {proc.stderr.read()[-3000:]}")
    return line


def test_reader_process_verifies_writer_process_digests(cluster, tmp_path):
    fmt = dict(address=cluster.ray_address, n=N_WIRE, pid=PID_WIRE)
    err = open(tmp_path / "reader.err", "w+")
    procs = []
    try:
        # Both children start together: each takes seconds to import and attach.
        reader = subprocess.Popen([sys.executable, "-c", _READER.format(**fmt)], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        procs.append(reader)
        writer = subprocess.run([sys.executable, "-c", _WRITER.format(**fmt)], text=True,
                                capture_output=True, timeout=180)
        assert writer.returncode == 0 and "written" in writer.stdout, writer.stderr[-3000:]
        endpoint = json.loads(_readline(reader, 120))["endpoint"]
        at = types.SimpleNamespace(endpoint=endpoint)

        def read() -> dict:
            reader.stdin.write("read\n")
            reader.stdin.flush()
            out = json.loads(_readline(reader, 60))
            assert out["rows"] == N_WIRE
            assert "__dpobs" not in " ".join(out["fields"])
            return scrape(at)

        fields = ("dense", "bf", "mask", "img", "one", "score", "tok")
        s = read()
        for f in fields:  # the writer's digests, recomputed by another process: all clean
            assert value(s, "dpobs_guard_rows_checked_total", field=f) == N_WIRE, f
            assert value(s, "dpobs_guard_rows_mismatched_total", field=f) == 0, f
            assert value(s, "dpobs_guard_rows_unverified_total", field=f) is None, f
        assert not any(k[0].startswith(("dpobs_guard_fields_skipped", "dpobs_guard_failures"))
                       for k in s)

        # A third, uninstrumented client rewrites one element of w3's dense row in place.
        row = call(tq.kv_batch_get, keys=["w3"], partition_id=PID_WIRE,
                   select_fields=["dense"], timeout_s=T)["dense"].unbind()[0].clone()
        row[5] += 1
        call(tq.kv_batch_put, keys=["w3"], partition_id=PID_WIRE, timeout_s=T,
             fields=TensorDict({"dense": row.unsqueeze(0)}, batch_size=[1]))

        s = read()
        assert value(s, "dpobs_guard_rows_mismatched_total", field="dense") == 1
        for f in fields:
            assert value(s, "dpobs_guard_rows_checked_total", field=f) == 2 * N_WIRE, f
            if f != "dense":
                assert value(s, "dpobs_guard_rows_mismatched_total", field=f) == 0, f
        reader.stdin.write("exit\n")
        reader.stdin.flush()
        assert reader.wait(60) == 0
        err.seek(0)
        log = err.read()
        assert "fingerprint mismatch: field=dense sample_id=w3 row=3" in log
        assert log.count("fingerprint mismatch") == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        err.close()
        call(tq.kv_clear, [f"w{i}" for i in range(N_WIRE)], PID_WIRE, timeout_s=T)
