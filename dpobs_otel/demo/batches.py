"""The demo's batches: one GRPO step's rollout rows (jagged tokens, logprobs and loss mask,
dense advantages normalised per group, per-row metadata), how they pack into a TensorDict,
and their payload bytes computed independently of dpobs's sizing."""
from __future__ import annotations

from dataclasses import dataclass

import msgpack
import torch
from tensordict import NonTensorStack, TensorDict

from ..names import (ALERT_UNMEASURED_CLIENTS, ALERT_WEIGHTS_MISMATCH, ALERT_WEIGHTS_STALE,
                     ALERT_WIRE_HASH_MISMATCH)

PARTITION = "grpo"
VOCAB = 32000
GROUP = 4  # GRPO: advantages are rewards normalised within each group of completions
FIELDS_LOGPROB_PASS = ["tokens", "mask"]
FIELDS_TRAIN_PASS = None  # every field, the verifier's scores included
ROLE_OPS = {"rollout": {"put"}, "trainer": {"get"}, "driver": {"register", "list", "clear"}}


@dataclass
class Config:
    steps: int = 100
    trainers: int = 2
    batch_size: int = 64
    min_len: int = 64
    max_len: int = 512
    latency_s: float = 0.005
    verify: bool = False
    corrupt_at: int | None = None  # measured step (1-based) whose row an outsider rewrites
    duration: float | None = None  # seconds of measured steps; 0 = until stopped; wins over steps
    sd_dir: str | None = None
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    seed: int = 0
    alternate: bool = False  # the overhead benchmark: every other step without dpobs
    backend: str = "memory"  # demo/backends.py
    prefetch: bool = False  # the rollout one step ahead, trainers read the next shard on a thread
    rollout_ms: float = 0.0  # compute per step: the rollout's before its put,
    train_ms: float = 0.0  # each trainer's after its reads
    job: str | None = None  # the Prometheus job (None: DPOBS_JOB, else "dpobs")
    async_k: int = 0  # --async K: no barrier, the rollout up to K steps ahead (asynchronous.py)
    row_age: bool = False  # dpobs.start(row_age=True) in every process
    trace: bool = False  # spans in every process (dpobs.start(trace=True))
    weight_sync: str | None = None  # the transport trainer 0 pushes weights over (weightsync.py)
    corrupt_weights_at: int | None = None  # measured step whose weights a bit flip hits
    skip_weight_sync_at: int | None = None  # measured step from which the rollout stops loading
    store_metrics: bool = False  # the store's own exporter on, its account in the report
    unmeasured: str | None = None  # a role whose processes move data without dpobs
    nodes: int = 1  # --backend ray: the Ray cluster's nodes on this machine (ray_plane.ray_up)

    def roles(self) -> list[tuple[str, int]]:
        return ([("rollout", 0)] + [("trainer", r) for r in range(self.trainers)]
                + [("driver", 0)])

    def faults_alert(self) -> set[str]:
        """The alerts the faults this run injects must raise (the report waits for them)."""
        return {alert for alert, on in ((ALERT_WIRE_HASH_MISMATCH, self.corrupt_at),
                                        (ALERT_WEIGHTS_MISMATCH, self.corrupt_weights_at),
                                        (ALERT_WEIGHTS_STALE, self.skip_weight_sync_at),
                                        (ALERT_UNMEASURED_CLIENTS, self.unmeasured))
                if on}


def sample_ids(step: int, n: int) -> list[str]:
    return [f"s{step}-{i}" for i in range(n)]


def make_rows(step: int, cfg: Config, gen: torch.Generator) -> dict[str, list]:
    """One step's rollout output as per-row Python/tensor values (before packing)."""
    n = cfg.batch_size
    lens = torch.randint(cfg.min_len, cfg.max_len + 1, (n,), generator=gen).tolist()
    rewards = torch.rand(n, generator=gen)
    groups = [list(range(g, min(g + GROUP, n))) for g in range(0, n, GROUP)]
    adv = torch.empty(n)
    for g in groups:
        r = rewards[g]
        adv[g] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return {
        "tokens": [torch.randint(0, VOCAB, (k,), generator=gen) for k in lens],
        "logprobs": [-5 * torch.rand(k, generator=gen) for k in lens],
        "mask": [torch.arange(k) >= k // 4 for k in lens],  # prompt tokens carry no loss
        "advantages": adv,
        "scores": torch.rand(n, generator=gen),  # written by the verifier, not the rollout
        # Fixed-width rows: sizing.py measures large non-tensor stacks by sampling rows, and
        # equal-sized rows keep that estimate exact, so bytes compare exactly with the truth.
        "meta": [{"uid": f"s{step:08d}-{i:05d}", "prompt": f"p{step:08d}-{i // GROUP:05d}",
                  "reward": float(rewards[i])} for i in range(n)],
    }


def pack(rows: dict[str, list]) -> TensorDict:
    jag = {k: torch.nested.as_nested_tensor(rows[k], layout=torch.jagged)
           for k in ("tokens", "logprobs", "mask")}
    n = len(rows["meta"])
    return TensorDict({**jag, "advantages": rows["advantages"],
                       "meta": NonTensorStack.from_list(rows["meta"])}, batch_size=[n])


def unpack(td: TensorDict) -> dict[str, list]:
    return {k: (td[k] if k == "meta" else td[k].unbind(0)) for k in td.keys()}


def truth_nbytes(td: TensorDict) -> int:
    """Payload bytes computed independently of dpobs's sizing: tensors by element count (a
    freshly built jagged tensor's values hold exactly its rows), metadata msgpack-encoded."""
    total = 0
    for key in td.keys():
        v = td[key]
        if isinstance(v, list):  # a NonTensorStack reads back as a list of its rows
            total += len(msgpack.packb(list(v)))
        elif v.is_nested:
            total += v.values().numel() * v.values().element_size()
        else:
            total += v.numel() * v.element_size()
    return total
