"""Weights for the weight-sync tests: a few named tensors of a transformer block's shapes,
and their payload bytes computed here, apart from dpobs."""
from __future__ import annotations

import torch


def model(step: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """A few named weights of the shapes a transformer block has, different every step."""
    g = torch.Generator().manual_seed(1000 + step)
    shapes = {"embed.weight": (64, 32), "layers.0.attn.qkv.weight": (96, 32),
              "layers.0.attn.qkv.bias": (96,), "layers.0.mlp.up.weight": (128, 32),
              "layers.0.norm.weight": (32,), "lm_head.weight": (64, 32)}
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}


def payload_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
