"""Where the guard's hooks run: helper threads with OpenMP at one thread for CPU tensors, the
calling thread for anything else; the caller's own OpenMP setting never touched."""
from __future__ import annotations

import threading

import torch
from tensordict import TensorDict

from dpobs_otel.guard import pool, sums


def _where_and_threads():
    return threading.current_thread().name, torch.get_num_threads()


def test_cpu_work_runs_on_a_helper_with_one_openmp_thread():
    before = torch.get_num_threads()
    td = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    name, threads = pool.run(_where_and_threads, where=td)
    assert name.startswith("dpobs-guard")
    if sums._openmp() is not None:  # torch's wheels ship libgomp
        assert threads == 1
    assert torch.get_num_threads() == before  # the caller's setting is its own


def test_accelerator_tensors_are_fingerprinted_on_the_calling_thread():
    td = TensorDict({"x": torch.zeros(3), "y": torch.empty(3, device="meta")}, batch_size=[3])
    assert not pool.on_cpu(td)
    name, _ = pool.run(_where_and_threads, where=td)
    assert name == threading.current_thread().name
    assert not pool.on_cpu(None) and pool.on_cpu(TensorDict({}, batch_size=[2]))
