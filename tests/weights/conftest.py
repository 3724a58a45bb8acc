"""Telemetries for the weight-sync tests: one per side, the guard on (the proof) unless a
test asks otherwise."""
from __future__ import annotations

import pytest
import torch

import dpobs_otel as dpobs


@pytest.fixture
def proving():
    made = []

    def start(role="trainer", guard=True, **kw):
        t = dpobs.start(role=role, rank=len(made), port=0, verify_tensor_hash=guard, **kw)
        made.append(t)
        return t

    yield start
    for t in made:
        t.shutdown()


def model(step: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """A few named weights of the shapes a transformer block has, different every step."""
    g = torch.Generator().manual_seed(1000 + step)
    shapes = {"embed.weight": (64, 32), "layers.0.attn.qkv.weight": (96, 32),
              "layers.0.attn.qkv.bias": (96,), "layers.0.mlp.up.weight": (128, 32),
              "layers.0.norm.weight": (32,), "lm_head.weight": (64, 32)}
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}


def payload_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
