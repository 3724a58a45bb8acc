"""In-process checkpoint engines on verl's base class for tests/adapters/verl: one of each
kind of send_weights / receive_weights verl's backends have (async generator, coroutine,
torch.no_grad()-decorated, a coroutine that returns a stream), all moving chunks made by
verl's own split_weight_chunks and put back by its merge_weight_chunks, within the process.

Loopback keeps the chunks its send made (copies, as a wire would), in order, for its
receive; `tamper(fn)` lets a test change them in between, as a faulty wire would."""
from __future__ import annotations

import asyncio
import inspect

import torch
from verl.checkpoint_engine.base import (CheckpointEngine, merge_weight_chunks,
                                         split_weight_chunks)


class Loopback(CheckpointEngine):
    def __init__(self, bucket_size: int = 1 << 20):
        self.bucket_size = bucket_size
        self.chunks: list = []
        self.given = None  # the `weights` object send_weights was handed

    def prepare(self):
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
        return {}, {}

    def init_process_group(self, **kwargs):
        pass

    def finalize(self):
        self.chunks = []

    async def send_weights(self, weights, global_steps: int | None = None):
        self.given = weights
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            self.chunks.append((meta, chunk.clone()))

    async def receive_weights(self, global_steps: int | None = None):
        async for item in merge_weight_chunks(self._replay(), self.bucket_size):
            yield item

    async def _replay(self):
        for meta, chunk in self.chunks:
            yield meta, chunk

    def tamper(self, fn) -> None:
        self.chunks = [fn(meta, chunk) for meta, chunk in self.chunks]


class NoGradLoopback(Loopback):
    """As verl's nccl backend: both methods under torch.no_grad(), which makes each a plain
    function returning a coroutine or an async generator."""

    @torch.no_grad()
    async def send_weights(self, weights, global_steps: int | None = None):
        self.given = weights
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            self.chunks.append((meta, chunk.clone()))

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None):
        async for item in merge_weight_chunks(self._replay(), self.bucket_size):
            yield item


class AwaitedStream(Loopback):
    """receive_weights as the base class declares it: a coroutine (that returns the stream)."""

    async def receive_weights(self, global_steps: int | None = None):
        return merge_weight_chunks(self._replay(), self.bucket_size)


class Chained(Loopback):
    """Overrides both methods and calls the parent's: one measurement, not two."""

    async def send_weights(self, weights, global_steps: int | None = None):
        await super().send_weights(weights, global_steps)

    async def receive_weights(self, global_steps: int | None = None):
        async for item in super().receive_weights(global_steps):
            yield item


class Patches(Loopback):
    """Moves something other than (name, tensor) pairs, as delta_sharded does."""

    wire_format = "delta_flush"

    async def receive_weights(self, global_steps: int | None = None):
        yield [("__values__", torch.zeros(3))], True


KINDS = (Loopback, NoGradLoopback, AwaitedStream)


def push(engine, weights: dict, version=None) -> None:
    """engine.send_weights of `weights`, awaited when it returns an awaitable."""
    result = engine.send_weights(iter(weights.items()), global_steps=version)
    if inspect.isawaitable(result):
        asyncio.run(result)


def pull(engine, version=None) -> list:
    """Every item engine.receive_weights yields, as a rollout engine's load takes them."""
    async def run():
        stream = engine.receive_weights(global_steps=version)
        if inspect.isawaitable(stream):
            stream = await stream
        if hasattr(stream, "__aiter__"):
            return [item async for item in stream]
        return list(stream)
    return asyncio.run(run())


def weights(version: int = 1) -> dict[str, torch.Tensor]:
    """A few bf16 and fp32 weights; embed.weight and layers.0.weight are larger than the 64-byte
    buckets the tests chunk by, the others fit one."""
    g = torch.Generator().manual_seed(version)
    return {"embed.weight": torch.randn(40, 8, generator=g).to(torch.bfloat16),
            "layers.0.bias": torch.randn(5, generator=g),
            "layers.0.weight": torch.randn(24, 6, generator=g),
            "lm_head.weight": torch.randn(3, 8, generator=g).to(torch.bfloat16)}


def payload(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
