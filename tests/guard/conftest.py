"""Fixtures of the guard tests."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="guard-test", rank=0, port=0, verify_tensor_hash=True)
    store = dpobs.InMemoryDataPlane()
    yield tel, tel.instrument(store), store
    tel.shutdown()


KERNELS = ("c", "torch")


def pytest_generate_tests(metafunc):
    """Tests that use the `kernel` fixture run on both kernels, but those marked
    torch_kernel (they patch the torch kernels' chunking), which run on that one alone."""
    if "kernel" in metafunc.fixturenames:
        torch_only = metafunc.definition.get_closest_marker("torch_kernel") is not None
        metafunc.parametrize("kernel", ["torch"] if torch_only else KERNELS, indirect=True)


@pytest.fixture
def kernel(request, monkeypatch):
    """The fingerprint's kernel for CPU tensors: the one-pass C one (guard/kernel.py) or, with
    it switched off, the torch kernels that accelerators and installs without a compiler
    use. Both must give reference.py's digests."""
    from dpobs_otel.guard import kernel as c_kernel

    if request.param == "c":
        assert c_kernel.LIB is not None, "the guard's C kernel was not built (setup.py)"
    else:
        monkeypatch.setattr(c_kernel, "LIB", None)
    return request.param
