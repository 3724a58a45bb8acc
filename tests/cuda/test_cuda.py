"""On a CUDA device: the same digests and weight fingerprints as on the CPU, bit for bit,
for every dtype and layout the guard takes, and the host syncs a guarded put and get and a
weight sync make, counted by torch.cuda.set_sync_debug_mode("warn") (one warning a sync)."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.guard.fingerprint import field_digests, id_salts
from dpobs_otel.guard.kernel import host_syncs
from dpobs_otel.weights import fingerprint as weights_fp
from helpers.layouts import DTYPES, ROWS, bits, layouts

IDS = [f"sample-{i}" for i in range(ROWS)]


@pytest.fixture
def guard(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="cuda-test", rank=0, port=0, verify_tensor_hash=True)
    try:
        yield tel.guard
    finally:
        tel.shutdown()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digests_on_cuda_equal_the_cpus(dtype):
    cpu_ids, gpu_ids = id_salts(IDS, "p"), id_salts(IDS, "p", device="cuda")
    pairs = zip(layouts(dtype), layouts(dtype, "cuda"))
    for (name, on_cpu), (_, on_gpu) in pairs:
        want = field_digests(on_cpu, "f", cpu_ids)
        got = field_digests(on_gpu, "f", gpu_ids)
        assert got.device.type == "cuda" and got.cpu().tolist() == want.tolist(), name


def test_cuda_matches_cpu():
    """(moved from tests/guard/test_fingerprint.py) bf16 dense, fp8 and int64 jagged."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn((ROWS, 4, 3), generator=g).to(torch.bfloat16)
    rows = [torch.randn((n, 2), generator=g).to(torch.float8_e4m3fn) for n in (1, 4, 0, 9, 2)]
    jag = torch.nested.nested_tensor(rows, layout=torch.jagged)
    tok = torch.nested.nested_tensor([torch.randint(-9, 9, (n,), generator=g)
                                      for n in (5, 1, 7, 2, 8)], layout=torch.jagged)
    for v in (dense, jag, tok):
        cpu = field_digests(v, "f", id_salts(IDS, "p"))
        gpu = field_digests(v.cuda(), "f", id_salts(IDS, "p", device="cuda"))
        assert gpu.device.type == "cuda" and gpu.cpu().tolist() == cpu.tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weight_fingerprints_on_cuda_equal_the_cpus(dtype, monkeypatch):
    model = {f"w{i}": bits(shape, dtype, i) for i, shape in
             enumerate([(33, 17), (5,), (0, 3), (1 << 12, 3)])}
    model["t"] = model["w0"].t()
    want = {k: weights_fp.fingerprint(k, t) for k, t in model.items()}
    monkeypatch.setattr(weights_fp, "DEVICE_PIECE", 1000)  # several pieces per tensor
    on_gpu = {k: t.cuda() for k, t in model.items()}
    assert weights_fp.settle({k: weights_fp.pending(k, t) for k, t in on_gpu.items()}) == want
    assert {k: weights_fp.fingerprint(k, t) for k, t in on_gpu.items()} == want


def _batch():
    lengths = [5, 1, 7, 2, 8]
    jag = [torch.randn(n).to(torch.bfloat16) for n in lengths]
    return TensorDict({
        "obs": torch.randn(ROWS, 4, 3, device="cuda").to(torch.bfloat16),
        "mask": torch.rand(ROWS, 9, device="cuda") > 0.5,
        "view": torch.randn(7, ROWS, device="cuda").t(),
        "logp": torch.nested.nested_tensor(jag, layout=torch.jagged).cuda(),
        "tokens": torch.nested.nested_tensor([torch.arange(n) for n in lengths],
                                             layout=torch.jagged).cuda(),
    }, batch_size=[ROWS])


def test_a_guarded_put_makes_no_host_sync_and_a_get_one(guard):
    batch = _batch()
    written, at_put = host_syncs(guard.before_put, IDS, "p", batch)
    got, at_get = host_syncs(guard.after_get, IDS, "p", written, None)
    totals = guard.totals()
    assert not totals.get("failures"), totals
    assert totals["checked"] == {k: ROWS for k in batch.keys()}
    assert not any(totals.get("mismatched", {}).values()) and set(got.keys()) == set(batch.keys())
    assert (at_put, at_get) == (0, 1)


def test_a_weight_syncs_fingerprints_come_back_in_one_transfer():
    model = {f"l{i}": torch.randn(256, 129, device="cuda").to(torch.bfloat16)
             for i in range(50)}
    kept, fingerprinting = host_syncs(lambda: {k: weights_fp.pending(k, t)
                                               for k, t in model.items()})
    digests, settling = host_syncs(weights_fp.settle, kept)
    assert (fingerprinting, settling) == (0, 1)
    assert digests == {k: weights_fp.fingerprint(k, t.cpu()) for k, t in model.items()}
