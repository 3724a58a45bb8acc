"""Every dtype the guard takes and the layouts it reads (dense, non-contiguous, jagged with a
row offset, jagged with strided values, narrowed), filled with random bits: the inputs the
device-path tests (tests/guard/test_device_path.py) and the CUDA tests (tests/cuda/) both
compare across paths and devices."""
from __future__ import annotations

import torch

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
          torch.bool]
ROWS = 5


def bits(shape, dtype, seed=0) -> torch.Tensor:
    """Random bits of dtype (every pattern, NaNs included: the fingerprint reads bits)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def layouts(dtype, device="cpu"):
    """(name, tensor of ROWS rows) for each layout, on `device`."""
    values = bits((17, 3), dtype, 1).to(device)
    cuts = torch.tensor([2, 5, 5, 10, 11, 15], device=device)  # offsets[0] > 0: some rows
    yield "dense", bits((ROWS, 7), dtype, 2).to(device)
    yield "strided", bits((9, ROWS), dtype, 3).to(device).t()
    yield "jagged", torch.nested.nested_tensor_from_jagged(values[:, 0].contiguous(), cuts)
    yield "jagged2d", torch.nested.nested_tensor_from_jagged(values[:, :2], cuts)
    yield "narrowed", torch.nested.nested_tensor_from_jagged(
        values, cuts, lengths=torch.tensor([2, 0, 5, 0, 3], device=device))
