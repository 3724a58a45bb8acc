"""One checkpoint-engine call measured as one side of one weight sync (tel.weights).

The version is the call's `global_steps` (the trainer step, as verl passes it). verl also
syncs with no step (`update_weights()` after a colocated reward pass: the same weights
again); such a call takes the last version this process synced on that side (0 before any),
so a re-sync never reads as a new version or as a receiver falling behind.

Receiving: the stream the engine yields, after verl's merge_weight_chunks has put each
tensor back together, goes through `tel.weights.received`, which counts and (guard on)
fingerprints every tensor and takes the sender's manifest item out before the rollout
engine sees anything. Sending: the engine's `weights` argument, before verl's
split_weight_chunks cuts anything, goes through the same stream wrapper as
`tel.weights.sent`, so the manifest item follows the last weight into the engine and is
chunked, moved and merged like any other tensor (docs/guides/frameworks/verl.md). The send's
sync ends when the call has returned and the stream has ended, whichever is last: a backend's last bucket
leaves after its last tensor was taken (the call is the sync), while the colocated `naive`
backend only stores the stream for its receive_weights to read later (the stream is).

Only engines whose `wire_format` is "named_tensors" (every backend but delta_sharded, which
moves sparse patches, not tensors) and a `weights` that is an iterable are measured; the
rest run as they are, said once per class. Every failure of dpobs here is counted in
dpobs_instrumentation_errors_total{component="adapter"} and the call runs unmeasured; a
receive that failed so still takes the sender's manifest item out of the stream, so that the
rollout engine never meets a tensor its model does not have.
"""
from __future__ import annotations

import inspect
import logging
import operator
import threading

from ... import names
from ...weights import MANIFEST_NAME, streams
from ...weights.sync import Sync

log = logging.getLogger(__name__)
NAMED_TENSORS = "named_tensors"


class SendCall:
    """One measured send_weights call: `args`/`kwargs` are the call's own with its stream
    measured (set once the stream is); the sync ends at the later of returned() and the
    stream's end."""

    def __init__(self, sync: Sync):
        self.args, self.kwargs = (), {}
        self._sync = sync
        self._open = 2  # the call and the stream
        self._lock = threading.Lock()

    # what the stream wrapper (weights/streams.py) calls
    def begin(self) -> None:
        self._sync.begin()

    def note_item(self, item) -> bool:
        return self._sync.note_item(item)

    def manifest(self):
        return self._sync.manifest()

    def end(self) -> None:
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last:
            self._sync.end()

    returned = end  # the call's end

    def after(self, result):
        """What a plain send_weights returned: an awaitable ends the call once awaited."""
        if inspect.isawaitable(result):
            return self._awaited(result)
        self.returned()
        return result

    async def _awaited(self, awaitable):
        try:
            return await awaitable
        finally:
            self.returned()


class VerlWeights:
    """The per-process measurement of checkpoint-engine calls (PerProcess builds one)."""

    def __init__(self, tel):
        self._tel = tel
        self._last = dict.fromkeys(names.WEIGHT_SIDES, 0)
        self._said: set = set()

    def send(self, engine, signature, args, kwargs) -> SendCall | None:
        try:
            bound = signature.bind(engine, *args, **kwargs)
            stream_arg = _stream_argument(signature)
            stream = bound.arguments.get(stream_arg)
            if not self._measurable(engine, stream):
                return None
            sync = Sync(self._tel.weights, self._version("send", bound), "send")
            sync.streamed = True  # proven like tel.weights.sent's, even if it moves nothing
            call = SendCall(sync)
            bound.arguments[stream_arg] = streams.through(call, stream)
            call.args, call.kwargs = bound.args, bound.kwargs
            return call
        except Exception as exc:  # the call goes to the engine as it came
            self._tel.internal_error(names.COMPONENT_ADAPTER, exc)
            return None

    def receive(self, engine, signature, args, kwargs, stream):
        try:
            if not self._measurable(engine, stream):
                return stream
            version = self._version("receive", signature.bind(engine, *args, **kwargs))
            return self._tel.weights.received(stream, version=version)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_ADAPTER, exc)
            return _without_manifest(stream)

    def _version(self, side: str, bound) -> int:
        steps = bound.arguments.get("global_steps")
        if steps is None:
            return self._last[side]
        version = operator.index(steps)
        if version < 0:
            raise ValueError(f"global_steps={steps!r}: a weight version is never negative")
        self._last[side] = version
        return version

    def _measurable(self, engine, stream) -> bool:
        wire = getattr(engine, "wire_format", NAMED_TENSORS)
        if wire == NAMED_TENSORS and (hasattr(stream, "__iter__") or hasattr(stream, "__aiter__")):
            return True
        kind = type(engine)
        if kind not in self._said:
            self._said.add(kind)
            log.info("dpobs: %s.%s (wire_format %r, %s stream) is not a (name, tensor) "
                     "stream: its weight syncs run unmeasured", kind.__module__,
                     kind.__qualname__, wire, type(stream).__name__)
        return False


def _without_manifest(stream):
    """`stream` less the sender's manifest item: what the measured wrapper would have handed
    the rollout engine, which would take a tensor of that name for a weight of its model."""
    if hasattr(stream, "__aiter__"):
        return _without_manifest_async(stream)
    return (item for item in stream if not _is_manifest(item))


async def _without_manifest_async(stream):
    async for item in stream:
        if not _is_manifest(item):
            yield item


def _is_manifest(item) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and item[0] == MANIFEST_NAME


def _stream_argument(signature) -> str:
    """The name of send_weights's stream: `weights` as the base class has it, else the first
    parameter after self."""
    params = list(signature.parameters)
    return "weights" if "weights" in params else params[1]
