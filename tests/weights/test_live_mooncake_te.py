"""Weights pushed through Mooncake's TransferEngine driven directly, between two real processes
over its TCP transport on loopback: the transfer calls made inside a sync block count with
their exact bytes (a trainer's per-tensor writes, a rollout's batched read, neither noting
anything), and with the guard on the fingerprints follow as one more transfer and every tensor
is checked. Skipped only when the mooncake wheel is absent."""
from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("the mooncake wheel is not installed "
                "(pip install mooncake-transfer-engine-non-cuda)", allow_module_level=True)

from helpers import weights_live as live  # noqa: E402
from helpers.weights_engines import MooncakeTE  # noqa: E402


@pytest.fixture(scope="module")
def pushed():
    return live.pushed(MooncakeTE)


def test_every_sync_counts_exactly_the_bytes_and_tensors_its_process_moved(pushed):
    live.check_counts(pushed)


def test_the_rollout_holds_the_trainers_weights_and_checks_every_tensor(pushed):
    live.check_proof(pushed)


def test_a_rollout_without_dpobs_holds_what_it_holds_without_dpobs_anywhere():
    live.check_unchanged(MooncakeTE)


# -- the wrapper's contract, on a stand-in engine class (no transfer) --------------------------
class _Engine:
    """TransferEngine's calls as the wheel names them: rc 0 is success."""
    rc = 0

    def transfer_sync_write(self, target, buffer, peer, length):
        if length < 0:
            raise ValueError("negative length")
        return self.rc

    def batch_transfer_sync_read(self, target, buffers, peers, lengths):
        return self.rc


def _wrapped():
    from types import SimpleNamespace

    from dpobs_otel.weights import transfers

    cls = type("TE", (_Engine,), dict(vars(_Engine)))
    transfers._mooncake(SimpleNamespace(TransferEngine=cls))
    return cls()


def test_only_successful_calls_in_an_open_sync_count_results_and_errors_unchanged(proving):
    tel, te = proving(guard=False), _wrapped()
    te.transfer_sync_write("h", 4096, 0, 100)  # no sync open: not counted
    with tel.weights.sync(version=1, side="send") as s:
        assert te.transfer_sync_write("h", 4096, 0, 100) == 0
        assert te.transfer_sync_write("h", 4096, 0, 100) == 0  # the buffer refilled: again
        assert te.batch_transfer_sync_read("h", [8192, 9000], [0, 0], [10, 20]) == 0
        te.rc = -1
        assert te.transfer_sync_write("h", 1 << 20, 0, 7) == -1  # failed: not counted
        with pytest.raises(ValueError, match="negative length"):
            te.transfer_sync_write("h", 1 << 21, 0, -1)
    assert (s.bytes, s.tensors) == (230, 4)
    assert not tel.stats.instr_errors.get("weights")


def test_a_noted_tensor_then_transferred_counts_once(proving):
    import torch
    tel, te, t = proving(guard=True), _wrapped(), torch.ones(8)
    with tel.weights.sync(version=1, side="send") as s:
        s.note("w", t)
        te.transfer_sync_write("h", t.data_ptr(), 0, 32)
    assert (s.bytes, s.tensors) == (32, 1)


def test_dpobss_own_error_is_swallowed_and_counted(proving):
    tel, te = proving(guard=False), _wrapped()
    with tel.weights.sync(version=1, side="send") as s:
        assert te.batch_transfer_sync_read("h", [1, 2], [0, 0], None) == 0  # lengths unreadable
    assert s.bytes == 0 and tel.stats.instr_errors["weights"] == 1


def test_nothing_is_imported_or_wrapped_by_dpobs_and_nothing_when_it_is_off():
    import subprocess
    import sys
    code = ("import sys, dpobs_otel as d; t = d.start(role='trainer', port=0)\n"
            "with t.weights.sync(version=1, side='send'): pass\n"
            "print(sorted(m for m in ('mooncake.engine', 'nixl_cu12') if m in sys.modules))\n"
            "import mooncake.engine as e\n"
            "with t.weights.sync(version=2, side='send'): pass\n"
            "print(hasattr(e.TransferEngine.transfer_sync_write, '__dpobs_wrapped__'))\n"
            "t.shutdown()")
    for off, wrapped in ((("DPOBS_DISABLED", "0"), "True"), (("DPOBS_DISABLED", "1"), "False"),
                         (("OTEL_SDK_DISABLED", "true"), "False")):
        env = {**__import__("os").environ, off[0]: off[1]}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        assert out == ["[]", wrapped], (off, out)
