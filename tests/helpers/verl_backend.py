"""A verl checkpoint-engine backend over torch.distributed gloo, written on verl's own base
class and helpers the way verl's nccl backend is (tests only; verl 0.9 registers no CPU
backend that moves bytes between processes). Loaded the way verl loads a user's backend:
`import_external_libs("helpers.verl_backend")` (checkpoint_engine.custom_backend_module),
which registers it in CheckpointEngineRegistry as BACKEND.

Rank 0 sends, every other rank receives. The sender cuts the weights into chunks with
verl's split_weight_chunks and packs them into a uint8 bucket of `bucket_size` bytes; each
full bucket is one broadcast of its chunk list, then one broadcast of its bytes. Each
receiver takes the buckets into one reused buffer and hands the chunks to verl's
merge_weight_chunks, which yields each tensor whole (a view into that buffer for a tensor
that fits one bucket: the consumer copies what it keeps, as a rollout engine's load does).
`corrupt_at=v`: a receiver flips one bit of the first bucket of version v on arrival, a
fault of the wire that nothing but a check of the bytes can see.

Nothing here names dpobs: what measures it is the zero-code path of the environment.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (CheckpointEngine, CheckpointEngineRegistry,
                                         merge_weight_chunks, split_weight_chunks)

BACKEND = "dpobs-test-gloo"


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int, init_method: str = "", corrupt_at: int | None = None):
        self.bucket_size = bucket_size
        self.init_method = init_method
        self.corrupt_at = corrupt_at
        self.bucket = None
        self.rank = -1

    def prepare(self) -> dict:
        self.bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        return {"init_method": self.init_method}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata):
        world = actor_wg_world_size + rollout_world_size
        master = metadata[0]["init_method"]

        def side(ranks):
            return {"rank": list(ranks), "world_size": [world] * len(ranks),
                    "init_method": [master] * len(ranks)}
        return (side(range(actor_wg_world_size)),
                side(range(actor_wg_world_size, world)))

    def init_process_group(self, rank: int, world_size: int, init_method: str):
        self.rank = rank
        dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                world_size=world_size)

    def finalize(self):
        self.bucket = None
        if dist.is_initialized():
            dist.destroy_process_group()

    async def send_weights(self, weights, global_steps: int | None = None):
        metas, offset = [], 0
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + meta.chunk_size > self.bucket_size:
                self._broadcast(metas, offset, last=False)
                metas, offset = [], 0
            meta.offset = offset
            self.bucket[offset:offset + meta.chunk_size] = chunk
            metas.append(meta)
            offset += meta.chunk_size
        self._broadcast(metas, offset, last=True)

    def _broadcast(self, metas, length: int, last: bool) -> None:
        dist.broadcast_object_list([(metas, length, last)], src=0)
        dist.broadcast(self.bucket[:length], src=0)

    async def receive_weights(self, global_steps: int | None = None):
        async for name, weight in merge_weight_chunks(self._chunks(global_steps),
                                                      self.bucket_size):
            yield name, weight

    async def _chunks(self, global_steps):
        first, last = True, False
        while not last:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            metas, length, last = box[0]
            dist.broadcast(self.bucket[:length], src=0)
            if first and global_steps is not None and global_steps == self.corrupt_at:
                self.bucket[1] ^= 0x40
            first = False
            for meta in metas:
                yield meta, self.bucket[meta.offset:meta.offset + meta.chunk_size]
