"""How the sender's fingerprints reach every receiver: in band, as one more (name, tensor)
item of the sync, and how a receiver checks what it got against them.

The item is named MANIFEST_NAME; its tensor is a flat uint8 tensor of UTF-8 JSON
({"format", "version", "tensors": {name: digest}}), about 30 bytes per weight. In band
because then it goes wherever the weights go, over the same transport, to every receiver
that takes them, and arrives with the version it belongs to: nothing to route, nothing to
match up afterwards. uint8 so that a transport that buckets tensors by dtype gives it a
bucket of its own instead of a cast; a transport that casts every tensor to one dtype
would corrupt it, and the receiver then counts an internal error and checks nothing.
The receiving wrapper removes it before the engine sees a tensor of it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

MANIFEST_NAME = "dpobs.weights.fingerprints"
FORMAT = "dpobs-weights/1"


def encode(version: int, digests: dict[str, int]) -> torch.Tensor:
    doc = {"format": FORMAT, "version": int(version), "tensors": digests}
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode(tensor: torch.Tensor) -> tuple[int, dict[str, int]]:
    """(version, {name: digest}); ValueError for anything that is not a manifest."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1)
    if raw.dtype != torch.uint8:
        raise ValueError(f"a weights manifest is uint8, got {raw.dtype}")
    doc = json.loads(bytes(raw.numpy().tobytes()).decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a dpobs weights manifest")
    tensors = doc["tensors"]
    return int(doc["version"]), {str(k): int(v) for k, v in tensors.items()}


@dataclass
class Check:
    """One receiver's check of one sync: every name either side knows, looked at once."""
    checked: int = 0
    mismatched: dict[str, int] = field(default_factory=dict)  # reason -> tensors
    names: dict[str, list[str]] = field(default_factory=dict)  # reason -> a few names


def compare(sent: dict[str, int], received: dict[str, int], keep: int = 5) -> Check:
    out = Check(checked=len(sent.keys() | received.keys()))
    reasons = {
        "value": [n for n, d in received.items() if n in sent and sent[n] != d],
        "missing": [n for n in sent if n not in received],
        "unexpected": [n for n in received if n not in sent],
    }
    for reason, bad in reasons.items():
        if bad:
            out.mismatched[reason] = len(bad)
            out.names[reason] = sorted(bad)[:keep]
    return out
