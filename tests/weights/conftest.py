"""Telemetries for the weight-sync tests: one per side, the guard on (the proof) unless a
test asks otherwise. In one process no store joins the two sides unless a test opens one
(`store`), so the proof travels in band here unless a test asks for the default
(in_band=False); tests/weights/test_weights_carriage.py covers the store."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def proving():
    made = []

    def start(role="trainer", guard=True, in_band=True, **kw):
        t = dpobs.start(role=role, rank=len(made), port=0, verify_tensor_hash=guard,
                        weights_in_band=in_band, **kw)
        made.append(t)
        return t

    yield start
    for t in made:
        t.shutdown()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A one-rank gloo group on a FileStore: its default store is the proof's board."""
    import torch.distributed as dist
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on loopback only
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    from torch.distributed.distributed_c10d import _get_default_store
    yield _get_default_store()
    dist.destroy_process_group()
