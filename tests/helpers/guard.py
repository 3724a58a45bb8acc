"""Shared pieces of the guard tests: reading the guard's counters, its mismatch log lines,
and the 8-row batch every test corrupts or reads (the guarded client is a fixture in
tests/guard/conftest.py)."""
from __future__ import annotations

import logging

import torch
from tensordict import NonTensorStack, TensorDict

GUARD_LOG = "dpobs_otel.guard"


# --------------------------------------------------------------------------- helpers


def metrics(tel) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in tel.registry.collect():
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(m, name, **labels) -> float:
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, lab), v in m.items() if n == name and want <= lab)


def by_field(m, name) -> dict[str, float]:
    return {dict(lab)["field"]: v for (n, lab), v in m.items() if n == name and v}


def mismatch_records(caplog) -> list[tuple[str, str, int]]:
    """(field, sample id, row index) of every mismatch line the guard logged."""
    out = []
    for r in caplog.records:
        if r.name == GUARD_LOG and r.levelno == logging.ERROR and "mismatch:" in r.getMessage():
            field, sid, row = r.args[0], r.args[1], r.args[2]
            out.append((field, sid, row))
    return out


# --------------------------------------------------------------------------- the matrix

N = 8
IDS = [f"s{i}" for i in range(N)]
TENSOR_FIELDS = ["fp32", "bf16", "fp8", "mask", "ids64", "tok", "adv", "shaped", "odd32", "odd16",
                 "pm1"]


def batch(seed=0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    tok_rows = [torch.randperm(1000, generator=g)[: 3 + (i * 5) % 9] for i in range(N)]
    return TensorDict({
        "fp32": torch.randn(N, 6, generator=g),
        "bf16": torch.randn(N, 6, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(N, 6, generator=g).to(torch.float8_e4m3fn),
        "mask": torch.rand(N, 7, generator=g) > 0.5,
        "ids64": torch.randint(0, 1 << 40, (N, 5), generator=g),
        "tok": torch.nested.nested_tensor(tok_rows, layout=torch.jagged),
        # GRPO advantages: one scalar repeated over an even number of tokens
        "adv": torch.randn(N, 1, generator=g).expand(N, 8).contiguous(),
        "shaped": torch.randn(N, 4, 8, generator=g),
        "odd32": torch.randn(N, 5, generator=g),  # odd-length rows, fp32 and bf16
        "odd16": torch.randn(N, 7, generator=g).to(torch.bfloat16),
        "pm1": torch.where(torch.rand(N, 8, generator=g) > 0.5, 1.0, -1.0),  # +-1 advantages
        "meta": NonTensorStack(*[f"prompt {i}" for i in range(N)]),
    }, batch_size=[N])


def _flip_bits(t: torch.Tensor, index: int) -> torch.Tensor:
    t = t.clone()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    t.view(width).view(-1)[index] ^= 1
    return t


def _swap(t: torch.Tensor, i: int, j: int) -> torch.Tensor:
    t = t.clone()
    t[i], t[j] = t[j].clone(), t[i].clone()
    return t


def _all_rows(rows, field, fn):
    for sid in IDS:
        rows[sid][(field,)] = fn(rows[sid][(field,)])


def _whole_row(rows, dst, src):
    rows[dst] = dict(rows[src])


def _swap_rows(rows, a, b):
    rows[a], rows[b] = rows[b], rows[a]
