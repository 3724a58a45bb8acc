"""The Triton block-sum kernel (guard/kernel.py) gives the torch kernels' digests, run
in Triton's interpreter on the CPU (TRITON_INTERPRET=1 when Triton is first imported). Where Triton is not installed (the CPU suite's virtualenv) there is nothing to test:
the kernel only ever runs where it imports. tests/cuda/ holds it to the CPU on a device."""
from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("on a device tests/cuda runs the kernel itself", allow_module_level=True)
if "triton" not in sys.modules:  # the interpreter is chosen when Triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"  # and a CPU-only machine can run no other Triton
pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton was imported before without its interpreter", allow_module_level=True)

from dpobs_otel.guard import kernel, sums  # noqa: E402
from dpobs_otel.guard.fingerprint import field_digests, id_salts  # noqa: E402
from dpobs_otel.weights import fingerprint as weights_fp  # noqa: E402
from helpers.layouts import DTYPES, ROWS, bits, layouts  # noqa: E402

IDS = id_salts([f"r{i}" for i in range(ROWS)], "p")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_kernel_gives_the_torch_kernels_digests(dtype, monkeypatch):
    monkeypatch.setattr(sums, "one_chunk", lambda device: True)
    monkeypatch.setenv("DPOBS_GUARD_TRITON", "0")
    want = {n: field_digests(v, "f", IDS).tolist() for n, v in layouts(dtype)}
    monkeypatch.setenv("DPOBS_GUARD_TRITON", "1")
    calls = []
    real = kernel.triton_block_sums
    monkeypatch.setattr(kernel, "triton_block_sums", lambda *a: calls.append(1) or real(*a))
    got = {n: field_digests(v, "f", IDS).tolist() for n, v in layouts(dtype)}
    assert got == want and calls and not kernel.triton_broken


def test_a_long_weight_over_many_programs(monkeypatch):
    t = bits((3 * 64 * kernel.TILE + 37,), torch.int32, 5)  # a ragged last program
    want = weights_fp.fingerprint("w", t)
    monkeypatch.setattr(sums, "one_chunk", lambda device: True)
    assert weights_fp.settle({"w": weights_fp.pending("w", t)}) == {"w": want}
    assert not kernel.triton_broken
