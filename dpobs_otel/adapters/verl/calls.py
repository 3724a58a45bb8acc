"""The measured send_weights and receive_weights put on an engine class (engines.py).

Each is the same kind of function as the engine's own: a coroutine function stays one, an
async generator function stays one (Ray and asyncio tell them apart by kind), a generator
function and a plain one too; verl's decorators (torch.no_grad()) make some of them plain
functions that return a coroutine or an async generator, which is handled by what the call
returns. functools.wraps keeps the name, the docstring and `__wrapped__` (the engine's own).

A call is measured only when the measured function is the one the engine's class resolves
(a subclass's override that calls super()'s is measured once, by the subclass's), when it
is not one of dpobs's own calls, and when dpobs runs in this process (`adapter()` is None
otherwise). Everything else goes to the engine's own function, unchanged.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

from ..instrumentation import MEASURED, is_own_call


def _mine(measured, name: str, engine) -> bool:
    return getattr(type(engine), name, None) is measured and not is_own_call()


def measured_send(fn: Callable, adapter: Callable) -> Callable:
    """send_weights(weights, global_steps): `weights` handed to the engine measured; the
    sync ends when the call has returned and the stream has ended, whichever is last."""
    signature = inspect.signature(fn)

    def begin(measured, engine, args, kwargs):
        meter = adapter() if _mine(measured, "send_weights", engine) else None
        return None if meter is None else meter.send(engine, signature, args, kwargs)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def measured(self, *args, **kwargs):
            call = begin(measured, self, args, kwargs)
            if call is None:
                return await fn(self, *args, **kwargs)
            try:
                return await fn(*call.args, **call.kwargs)
            finally:
                call.returned()
    else:
        @functools.wraps(fn)
        def measured(self, *args, **kwargs):
            call = begin(measured, self, args, kwargs)
            if call is None:
                return fn(self, *args, **kwargs)
            try:
                result = fn(*call.args, **call.kwargs)
            except BaseException:
                call.returned()
                raise
            return call.after(result)
    setattr(measured, MEASURED, True)
    return measured


def measured_receive(fn: Callable, adapter: Callable) -> Callable:
    """receive_weights(global_steps): the stream it returns (or yields) handed back measured."""
    signature = inspect.signature(fn)

    def received(measured, engine, args, kwargs, stream):
        meter = adapter() if _mine(measured, "receive_weights", engine) else None
        if meter is None:
            return stream
        return meter.receive(engine, signature, args, kwargs, stream)

    measured = _receive_of_kind(fn, received)
    setattr(measured, MEASURED, True)
    return measured


def _receive_of_kind(fn, received):
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def measured(self, *args, **kwargs):
            stream = received(measured, self, args, kwargs, fn(self, *args, **kwargs))
            try:
                async for item in stream:
                    yield item
            finally:
                await stream.aclose()
    elif inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def measured(self, *args, **kwargs):
            return (yield from received(measured, self, args, kwargs, fn(self, *args, **kwargs)))
    elif inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def measured(self, *args, **kwargs):
            return received(measured, self, args, kwargs, await fn(self, *args, **kwargs))
    else:
        @functools.wraps(fn)
        def measured(self, *args, **kwargs):
            result = fn(self, *args, **kwargs)
            if inspect.isawaitable(result):
                return _then(result, lambda r: received(measured, self, args, kwargs, r))
            return received(measured, self, args, kwargs, result)
    return measured


async def _then(awaitable, after):
    return after(await awaitable)
