"""The CUDA-only tests: every test here is marked `cuda` and skipped where torch sees no
CUDA device (CI's CPU machines). They import no Ray, TransferQueue or Mooncake, so they
collect on a bare device machine (benchmarks/gpu_check.py runs them there)."""
from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
