"""Weights pushed through NIXL driven directly (an agent per process, its UCX backend over TCP
on loopback), between two real processes: the transfer requests posted inside a sync block
count with their exact bytes (a trainer's per-tensor initialize_xfer writes, a rollout's
prepared batched read, neither noting anything), and with the guard on the fingerprints follow
as one more transfer and every tensor is checked. Skipped only when no NIXL wheel is installed
(`pip install nixl-cu12`: its UCX runs on the CPU, no GPU needed)."""
from __future__ import annotations

import importlib.util

import pytest

if not any(importlib.util.find_spec(m) for m in ("nixl", "nixl_cu12")):
    pytest.skip("no NIXL wheel is installed (pip install nixl-cu12)", allow_module_level=True)

from helpers import weights_live as live  # noqa: E402
from helpers.weights_engines import Nixl  # noqa: E402


@pytest.fixture(scope="module")
def pushed():
    return live.pushed(Nixl)


def test_every_sync_counts_exactly_the_bytes_and_tensors_its_process_moved(pushed):
    live.check_counts(pushed)


def test_the_rollout_holds_the_trainers_weights_and_checks_every_tensor(pushed):
    live.check_proof(pushed)


def test_a_rollout_without_dpobs_holds_what_it_holds_without_dpobs_anywhere():
    live.check_unchanged(Nixl)
