"""The accelerators' code path (sums.one_chunk true: one chunk, the jagged scatter, digests
kept on the device) run on CPU tensors gives the CPU path's digests, for every dtype the
guard takes and every layout; tests/cuda/ holds the same on a real device."""
from __future__ import annotations

import pytest
import torch

from dpobs_otel.guard import sums
from dpobs_otel.guard.fingerprint import field_digests, id_salts
from dpobs_otel.weights import fingerprint as weights_fp
from helpers.layouts import DTYPES, ROWS, bits, layouts

IDS = id_salts([f"r{i}" for i in range(ROWS)], "p")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_device_path_equals_the_cpu_path(dtype, monkeypatch):
    cpu = {name: field_digests(v, "f", IDS).tolist() for name, v in layouts(dtype)}
    monkeypatch.setattr(sums, "one_chunk", lambda device: True)
    dev = {name: field_digests(v, "f", IDS).tolist() for name, v in layouts(dtype)}
    assert dev == cpu
    assert len(set(cpu["jagged"])) == ROWS  # rows differ: a constant would pass the above


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64, torch.bool], ids=str)
def test_a_weights_device_pieces_recombine_to_the_cpu_fingerprint(dtype, monkeypatch):
    model = {f"w{i}": bits(shape, dtype, i)
             for i, shape in enumerate([(13, 11), (3,), (0, 4), (40,)])}
    model["t"] = model["w0"].t()
    want = {k: weights_fp.fingerprint(k, t) for k, t in model.items()}
    monkeypatch.setattr(sums, "one_chunk", lambda device: True)
    monkeypatch.setattr(weights_fp, "DEVICE_PIECE", 7)  # many pieces, a ragged last one
    kept = {k: weights_fp.pending(k, t) for k, t in model.items()}
    assert all(isinstance(v, torch.Tensor) for k, v in kept.items() if model[k].numel())
    assert weights_fp.settle(kept) == want
    assert len(set(want.values())) == len(want)
