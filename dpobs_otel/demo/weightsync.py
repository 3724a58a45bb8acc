"""`dpobs demo --weight-sync gloo|mooncake`: after its optimizer step, trainer 0 pushes the model's
weights to the rollout (a refit), every step, each side measured by tel.weights and, with the
guard on, every tensor checked against the sender's fingerprints. The version is the trainer's
step (0: the warm-up's).

The model: the 39 bf16 tensors of a small GQA decoder (4 layers, hidden 768), 62.9 MB, seeded,
changed every step by one deterministic optimizer step, so every version differs.

The trainer pushes inside its step (the refit is part of the step it pays for); the rollout
loads between its steps, as an inference engine loads weights between generation batches.

The workload's own truth, beside dpobs's: its clock around its send and its load loops, the
bytes as numel x element size of the tensors it sends and loads, and the rollout's comparison
of every tensor it loaded with its own replay of the trainer's updates (same seed, same
steps), a check that shares nothing with the fingerprints.

--corrupt-weights-at N: at step N one bf16 element of one tensor has its sign bit flipped on
the rollout's side, in flight: after the transport delivered it, before the engine (and the
receiving wrapper) see it. --skip-weight-sync-at N: from step N on, the rollout's engine stops
loading: the sender still sends and the transport still delivers (a broadcast needs every
member of its group), but the load, the path a user wraps with tel.weights.received, returns
before it starts, as a silently broken update path does; the rollout stays on version N-1."""
from __future__ import annotations

from time import perf_counter

import torch

from .gloo import Gloo, SENDER
from .mooncake_te import MooncakeTE
from .weightsync_report import TRANSPORTS as TRANSPORT_NAMES

HIDDEN, KV, FFN, VOCAB, LAYERS = 768, 256, 2048, 4096, 4  # KV: 4 of 12 heads of 64
LR = 2.0 ** -7
CORRUPTED = "model.layers.1.mlp.down_proj.weight"  # the tensor --corrupt-weights-at flips
SIGN = -(1 << 15)  # the sign bit of a bf16 word read as int16
TRANSPORTS = dict(zip(TRANSPORT_NAMES, (Gloo, MooncakeTE)))
# Transports whose two processes share no control store (no process group, no Ray): the
# guard's fingerprints ride in the stream, as DPOBS_WEIGHTS_IN_BAND=1 would have them; over
# gloo they travel beside it, through the group's store (docs/guides/weights.md)
IN_BAND = {"mooncake"}


def shapes() -> dict[str, tuple[int, ...]]:
    """The model's tensors in a state_dict's order."""
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                p + "self_attn.k_proj.weight": (KV, HIDDEN),
                p + "self_attn.v_proj.weight": (KV, HIDDEN),
                p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                p + "mlp.gate_proj.weight": (FFN, HIDDEN),
                p + "mlp.up_proj.weight": (FFN, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, FFN),
                p + "input_layernorm.weight": (HIDDEN,),
                p + "post_attention_layernorm.weight": (HIDDEN,)}
    return out | {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}


class Model:
    """The trainer's weights, or the rollout's replay of them. A step is w -= LR * g, where g
    is a window of one fixed noise buffer placed by the step and the tensor: every version
    differs, and no random numbers are drawn per step."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.tensors = {name: (torch.ones(s) if len(s) == 1 else 0.02 * torch.randn(s, generator=g))
                        .to(torch.bfloat16) for name, s in shapes().items()}
        biggest = max(t.numel() for t in self.tensors.values())
        self.noise = torch.randn(2 * biggest, generator=g).to(torch.bfloat16)

    def update(self, step: int) -> None:
        room = self.noise.numel()
        for k, t in enumerate(self.tensors.values()):
            at = (step * 7919 + k * 104729) % (room - t.numel())
            t.add_(self.noise[at:at + t.numel()].view_as(t), alpha=-LR)


def nbytes(tensors) -> int:
    """Payload bytes, counted by the workload: element count x element size."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _account(truth, side: str, version: int, seconds: float, tensors: dict) -> dict:
    """This period's truth of one side (truth.extra, reset by Truth.take)."""
    w = truth.extra.setdefault("weights", {"side": side, "syncs": 0, "seconds": 0.0,
                                           "bytes": 0, "tensors": 0, "compared": 0,
                                           "differ": {}})
    w["syncs"] += 1
    w["seconds"] += seconds
    w["bytes"] += nbytes(tensors.values())
    w["tensors"] += len(tensors)
    w["version"] = version
    return w


class _Side:
    in_band = False
    SETTLE_S = 5.0  # at the end, for the last version's proof still in the store

    def __init__(self, transport):
        self.transport = transport
        self._weights = None

    def weights(self, dp):
        """dp.weights, its proof in band where the transport shares no store."""
        if self.in_band:
            dp.weights.in_band = True
        self._weights = dp.weights
        return dp.weights

    def close(self) -> None:
        """The last post made and the last check counted before the report reads them."""
        if self._weights is not None:
            self._weights.settle(self.SETTLE_S)
        self.transport.close()


class Sender(_Side):
    """Trainer 0: one optimizer step, then the push of the new version (inside its step)."""

    def __init__(self, cfg, transport):
        super().__init__(transport)
        self.model = Model(cfg.seed)

    def step(self, dp, truth, step: int) -> None:
        self.model.update(step)
        t0 = perf_counter()
        self.transport.send(self.weights(dp).sent(self.model.tensors.items(), version=step))
        _account(truth, "send", step, perf_counter() - t0, self.model.tensors)


class Receiver(_Side):
    """The rollout: takes each version the trainer sends into the weights its engine holds
    (after its step), unless --skip-weight-sync-at has stopped its loads."""

    def __init__(self, cfg, transport):
        super().__init__(transport)
        self.replay = Model(cfg.seed)
        self.corrupt_at, self.skip_from = cfg.corrupt_weights_at, cfg.skip_weight_sync_at
        self.engine: dict[str, torch.Tensor] = {}

    def step(self, dp, truth, step: int) -> None:
        self.replay.update(step)
        arriving = self.transport.receive()
        if self.skip_from is not None and step >= self.skip_from:
            for _ in arriving:  # delivered, never loaded: the engine keeps the old version
                pass
            return
        if step == self.corrupt_at:
            arriving = _flipped(arriving)
        t0 = perf_counter()
        loaded = dict(self.weights(dp).received(arriving, version=step))
        w = _account(truth, "receive", step, perf_counter() - t0, loaded)
        self.engine.update(loaded)
        _compare(w, self.replay.tensors, loaded)


def _flipped(items):
    """The items as they arrive, one element of CORRUPTED with its sign bit flipped."""
    for name, tensor in items:
        if name == CORRUPTED:
            word = tensor.view(-1).view(torch.int16)
            word[word.numel() // 2] ^= SIGN
        yield name, tensor


def _compare(w: dict, want: dict, got: dict) -> None:
    """The workload's own check of one load: every name either side has, compared."""
    differ = w["differ"]
    w["compared"] += len(want.keys() | got.keys())
    for name in want.keys() | got.keys():
        reason = ("missing" if name not in got else "unexpected" if name not in want
                  else None if _same(want[name], got[name]) else "value")
        if reason is not None:
            differ[reason] = differ.get(reason, 0) + 1


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape and bytes (a sign flipped on a zero changes no value)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def participant(role: str, rank: int, cfg, port):
    """This process's part in the weight sync (trainer 0 sends, the rollout receives), or
    None: the other trainers and the driver take no part, and none does without
    --weight-sync."""
    if not cfg.weight_sync or (role, rank) not in (("trainer", 0), ("rollout", 0)):
        return None
    transport = TRANSPORTS[cfg.weight_sync](SENDER if role == "trainer" else 1, 2, port)
    side = (Sender if role == "trainer" else Receiver)(cfg, transport)
    side.in_band = cfg.weight_sync in IN_BAND
    return side
