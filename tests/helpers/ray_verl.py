"""verl 0.9.1's real single controller on the CPU, unchanged by dpobs: a RayWorkerGroup over
RayResourcePool([2], use_gpu=False, max_colocate_count=1) whose Worker methods are registered
with verl's @register, so verl itself splits each DataProto, puts the chunks from a thread pool
(parallel_put, through make_nd_compute_dataproto_dispatch_fn), calls every worker and collects
with func_generator's ray.get; and a fused group (create_colocated_worker_cls_fused), whose
calls travel as `_fuw_execute("actor_fwmn_<method>", ...)`.

It records its own truth beside: a digest of every result's tensors, how many times each
method ran on the workers (each worker counts its own calls), and Ray's object sizes
(ray.experimental.get_object_locations) of the same chunks put again and of the same calls'
results, both taken after the scrape so they never enter the numbers scraped. Before it
shuts Ray down it scrapes every dpobs target in DPOBS_SD_DIR, if any (helpers/ray_job.py).

    python -m helpers.ray_verl OUT.json        # the environment says whether dpobs is on

Run by tests/adapters/ray/test_ray_verl.py in a subprocess, as a user would run a trainer.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter

import ray
import torch
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import (Dispatch, make_nd_compute_dataproto_dispatch_fn,
                                                   register)
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import create_colocated_worker_cls_fused

from helpers.ray_job import scrape_all
from helpers.ray_runs import forwarded, job_main

WORLD = 2
ROWS, COLS = 256, 256  # 256 KiB of float32 a batch: each worker's half is over Ray's 100 KiB
MESH = "rollout"
ROUNDS = 2  # calls of each method by the driver
ND_GROUPS = 2  # groups whose generate_sequences verl dispatches through the nd mesh


class Counting(Worker):
    """A verl Worker that counts the calls it served (the job's truth, not dpobs's)."""

    def __init__(self):
        super().__init__()
        self._register_dispatch_collect_info(MESH, dp_rank=self.rank, is_collect=True)
        self.calls: Counter = Counter()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def served(self) -> dict:
        return dict(self.calls)


class Rollout(Counting):
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name=MESH))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls["generate_sequences"] += 1
        ids = prompts.batch["input_ids"]
        return DataProto.from_dict(tensors={"responses": ids * 2.0 + self.rank,
                                            "lengths": prompts.batch["lengths"] + 1})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        self.calls["update_actor"] += 1
        return DataProto.from_dict(tensors={"loss": data.batch["input_ids"].pow(2).mean(dim=1)})


class Critic(Counting):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        self.calls["compute_values"] += 1
        return DataProto.from_dict(tensors={"values": data.batch["input_ids"].sum(dim=1)})


def _batch(seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(tensors={"input_ids": torch.randn(ROWS, COLS, generator=g),
                                        "lengths": torch.arange(ROWS) + seed})


def _digest(outputs: list[DataProto]) -> str:
    h = hashlib.sha256()
    for out in outputs:
        for key in sorted(out.batch.keys()):
            h.update(key.encode() + out.batch[key].numpy().tobytes())
    return h.hexdigest()


def _sizes(refs) -> list[int]:
    locations = ray.experimental.get_object_locations(refs)
    return [int(locations[r]["object_size"]) for r in refs]


def _served(*groups) -> dict:
    """Calls each method served, summed over every worker of `groups` ({label: calls})."""
    total: Counter = Counter()
    for label, group in groups:
        for counts in group.served():
            total.update({f"{label}.{name}": n for name, n in counts.items()})
    return dict(total)


def _pool() -> RayResourcePool:
    return RayResourcePool([WORLD], use_gpu=False, max_colocate_count=1)


def _groups():
    plain = RayWorkerGroup(_pool(), RayClassWithInitArgs(cls=ray.remote(Rollout)),
                           device_name="cpu")
    fused_cls = create_colocated_worker_cls_fused(
        {"actor": RayClassWithInitArgs(cls=ray.remote(Rollout)),
         "critic": RayClassWithInitArgs(cls=ray.remote(Critic))})
    fused = RayWorkerGroup(_pool(), fused_cls, device_name="cpu")
    fused.fuse(["actor", "critic"])
    return plain, fused


def _truth_sizes(plain, batches) -> dict:
    """Ray's object sizes of what verl put (the same chunks put again, once for each of the
    ND_GROUPS calls that dispatched them) and of what the plain group's generate_sequences
    returned (the same calls made again, by ref as verl makes them)."""
    chunks = [b.chunk(chunks=WORLD) for b in batches]
    puts = [ray.put(c) for batch in chunks for _ in range(ND_GROUPS) for c in batch]
    returned = [r for i in range(0, len(puts), ND_GROUPS * WORLD)
                for r in plain.execute_all_async("generate_sequences", puts[i:i + WORLD])]
    ray.get(returned)  # Ray knows an object's size once it is stored
    return {"put": _sizes(puts), "returned": _sizes(returned)}


def job() -> dict:
    plain, fused = _groups()
    batches = [_batch(i) for i in range(ROUNDS)]
    outputs = []
    for batch in batches:
        outputs.append(plain.generate_sequences(batch))
        outputs.append(plain.update_actor(batch))
        outputs.append(fused.actor.generate_sequences(batch))
        outputs.append(fused.critic.compute_values(batch))
    fused_class = fused.ray_cls_with_init.cls.__ray_actor_class__.__name__  # verl names it
    truth = {"digest": _digest(outputs), "world": WORLD, "rounds": ROUNDS,
             "fused_class": fused_class,
             "served": _served((Rollout.__name__, plain), (f"{fused_class}.actor", fused.actor),
                               (f"{fused_class}.critic", fused.critic))}
    truth["metrics"] = scrape_all(os.environ.get("DPOBS_SD_DIR"))
    truth["sizes"] = _truth_sizes(plain, batches)
    return truth


def main() -> None:
    job_main(job, address="local", num_cpus=2 * WORLD + 1, include_dashboard=False,
             object_store_memory=100 * 1024**2, runtime_env={"env_vars": forwarded()})


if __name__ == "__main__":
    main()
