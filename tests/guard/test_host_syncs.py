"""The host syncs a guarded put and get, a weight sync's fingerprints and sizing make on CUDA
tensors, counted on the CPU: the real CUDA code path runs under torch's FakeTensorMode (its
tensors made with device="cuda", no device needed), and a dispatch mode counts every op that
makes the host wait for the device: a copy to the host (.cpu(), .tolist()), a scalar read
(.item(), int()), a blocking copy to the device, an op whose output size depends on the data.
On a device, benchmarks/gpu_check.py holds the same counts with
torch.cuda.set_sync_debug_mode("error")."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

from dpobs_otel import sizing
from dpobs_otel.weights import fingerprint as weights_fp

aten = torch.ops.aten
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten.unique_dim.default,
                  aten._unique2.default, aten.repeat_interleave.Tensor}


def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


class HostSyncs(TorchDispatchMode):
    """Counts the ops that make the host wait for a device, by kind. Scalar reads answer 0
    (a fake tensor has no values): the count, not the value, is what is held."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._kind(func, args, kwargs)
        if kind:
            self.seen.append(kind)
        if func is aten._local_scalar_dense.default:
            return 0
        return func(*args, **kwargs)

    @staticmethod
    def _kind(func, args, kwargs):
        src = args[0] if args else None
        if func is aten._local_scalar_dense.default:
            return "scalar read" if _on_device(src) else None
        if func is aten._to_copy.default:
            to = torch.device(kwargs.get("device") or src.device)
            if _on_device(src) and to.type == "cpu":
                return "copy to host"
            if not _on_device(src) and to.type != "cpu" and not kwargs.get("non_blocking"):
                return "blocking copy to device"
        if func is aten.copy_.default and _on_device(args[1]) != _on_device(args[0]):
            return "copy to host" if _on_device(args[1]) else "blocking copy to device"
        if func in DATA_DEPENDENT and _on_device(src):
            if func is not aten.repeat_interleave.Tensor or kwargs.get("output_size") is None:
                return "data-dependent size"
        return None


@pytest.fixture
def fake():
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
        yield


def _jagged(lengths, inner, dtype, narrow=False):
    total = sum(lengths)
    values = torch.zeros((total + 3, *inner), dtype=dtype, device="cuda")
    cuts = [3]
    for n in lengths:
        cuts.append(cuts[-1] + n)
    offsets = torch.tensor(cuts, dtype=torch.int64, device="cuda")  # offsets[0] > 0
    shorter = torch.tensor([max(0, n - 1) for n in lengths], device="cuda") if narrow else None
    return torch.nested.nested_tensor_from_jagged(values, offsets, lengths=shorter)


def _batch(n=6):
    lengths = [5, 1, 7, 2, 2, 8][:n]
    return TensorDict({
        "obs": torch.zeros((n, 4, 3), dtype=torch.bfloat16, device="cuda"),
        "mask": torch.zeros((n, 5), dtype=torch.bool, device="cuda"),
        "view": torch.zeros((5, n), dtype=torch.float32, device="cuda").t(),  # not contiguous
        "tokens": _jagged(lengths, (), torch.int64),
        "logp": _jagged(lengths, (), torch.bfloat16),  # rows end mid-word: the scatter
        "pairs": _jagged(lengths, (2,), torch.float8_e4m3fn, narrow=True),
    }, batch_size=[n])


def test_the_counter_sees_every_kind_of_host_sync(fake):
    """The control: each way code makes the host wait is counted (or the zeros below would
    prove nothing)."""
    x = torch.ones(4, 3, device="cuda")
    with HostSyncs() as syncs:
        x.sum().item()
        x.cpu()
        x.to("cpu", non_blocking=True)  # still a wait before the host may read it
        torch.tensor([1, 2]).to(x.device)
        torch.repeat_interleave(x.to(torch.int64).reshape(-1))  # its size: the sum
        torch.tensor([1, 2]).to(x.device, non_blocking=True)  # queued: not a sync
        x.narrow(0, 0, 2).sum(1)
    assert syncs.seen[:3] == ["scalar read", "copy to host", "copy to host"]
    assert syncs.seen[-2:] == ["blocking copy to device", "data-dependent size"]


def test_a_guarded_put_makes_no_sync_and_a_get_exactly_one(fake, guarded):
    """Every field's digests stay on the device at put (they go to the store in their
    columns); a get compares there and brings all fields' flags back in one transfer."""
    guard, ids = guarded[0].guard, [f"s{i}" for i in range(6)]
    batch = _batch()
    with HostSyncs() as put:
        written = guard.before_put(ids, "p", batch)
    with HostSyncs() as get:
        guard.after_get(ids, "p", written, None)
    totals = guard.totals()
    assert not totals.get("failures"), totals
    assert not totals.get("skipped"), totals
    assert set(totals["recorded"]) == set(batch.keys()) and len(written.keys()) == 12
    for field in batch.keys():  # every row of every field was compared (or counted unverified)
        seen = totals.get("checked", {}).get(field, 0) + totals.get("unverified", {}).get(field, 0)
        assert seen == 6, (field, totals)
    assert put.seen == []
    assert get.seen == ["copy to host"]


def test_a_weight_syncs_fingerprints_come_back_in_one_transfer(fake):
    """pending() leaves each tensor's digest on the device, settle() brings a sync's worth
    back at once; fingerprint() alone is one per tensor (what a sync must not call)."""
    model = {f"layer{i}.{k}": torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
             for i in range(40) for k, shape in (("w", (64, 33)), ("b", (7,)))}
    model["odd.t"] = torch.zeros((6, 5), dtype=torch.float16, device="cuda").t()
    with HostSyncs() as syncs:
        digests = weights_fp.settle({k: weights_fp.pending(k, t) for k, t in model.items()})
    assert syncs.seen == ["copy to host"]
    assert list(digests) == list(model) and all(isinstance(d, int) for d in digests.values())
    with HostSyncs() as each:
        weights_fp.fingerprint("layer0.w", model["layer0.w"])
    assert each.seen == ["scalar read"]


def test_sizing_reads_metadata_only(fake):
    batch = _batch()
    with HostSyncs() as syncs:
        total = sizing.payload_nbytes(batch)
        per_field = sizing.field_nbytes(batch)
    assert syncs.seen == []
    assert total == sum(per_field.values()) > 0
