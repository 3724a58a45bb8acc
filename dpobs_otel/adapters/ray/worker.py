"""The worker's side of a Ray task, as the serializer hooks in ops.py see it outside any
op: the arguments a task deserializes before its method runs (ray_args), each return value
it serializes after (ray_return), and a lone object read outside a frame (an `await ref`).
Patches (ops.py) takes these methods; the thread-local state the C and Python op paths share
lives here.
"""
from __future__ import annotations

import functools
import threading

from ... import names
from ...shims import ray_private as ray_names
from .locality import LOCAL, UNKNOWN, split
from .methods import carried, internal

_local = threading.local()
# This thread's method is one of Ray's own (methods.internal): its return is not recorded.
INTERNAL = object()


class WorkerSide:
    """Patches' methods for what a worker's serializer does outside any op (ops.py's
    meter(), _safely() and failed are Patches')."""

    def _serialized_outside(self, args, kwargs, serialized, dt):
        """A serialization outside any op: on a worker, a return value of its task's."""
        if self._in_worker():
            self._returned(serialized, dt)

    def _read_outside(self, args, kwargs, values, dt, hook=None):
        """A deserialization outside any op (`hook`: the Python frame that saw it; from C,
        this call's own, since C leaves none): a task's arguments on a worker, or an `await
        ref`; neither when Ray reads an error to raise it, or objects of a transport of its
        own (rdt_objects)."""
        _, serialized, refs, *rest = args
        if not rest and (kwargs or {}).get("rdt_objects") is None \
                and ray_names.caller_name(hook or ray_names.this_frame()) \
                != ray_names.RAISES_ERRORS:
            self._unframed_read(serialized, refs, values, dt)

    def _in_worker(self) -> bool:
        """Is this process a Ray worker? Asked on every serialization outside an op, so the
        answer is kept once Ray has connected (a driver's too: until then, asked again)."""
        if self._worker is None:
            try:
                kind = ray_names.process_kind()
            except Exception:
                return False
            if kind is None:
                return False
            self._worker = kind == "worker"
        return self._worker

    def _returned(self, serialized, dt):
        meter = self.meter()
        if meter is not None:
            method = getattr(_local, "method", None) or meter.methods.label(
                "", ray_names.current_task())
            if method is INTERNAL:
                return
            meter.record(names.RAY_RETURN, method, dt, 1, ray_names.object_size(serialized), dt)

    def _unframed_read(self, serialized, refs, values, dt):
        meter = self.meter()
        if meter is None:
            return
        if self._in_worker() and ray_names.is_args(values):
            args = (len(values) // 2, sum(map(ray_names.stored_size, serialized[1::2])), dt,
                    self._safely(_args_moved, meter.where, serialized, refs))
            if ray_names.hosts_actor():  # the method's executor, next, records them
                _local.args = args
                return
            cls, _, name = ray_names.current_task().rpartition(".")
            self._args_done(meter, meter.methods.label(cls, name), args)
        elif len(serialized) == 1 and refs and refs[0] is not None:  # an `await ref`
            nbytes = ray_names.stored_size(serialized[0])
            meter.record(names.RAY_GET, meter.methods.of(refs), dt, 1, nbytes, dt,
                         data=dt, moved=((UNKNOWN, nbytes, None),))


    def executor(self, fn):
        """Ray's maker of actor-method executors: each executor made names the method it runs
        (a dispatcher: the one it carries) for this thread's ray_args, recorded now, and its
        ray_return, serialized next on this thread (an async actor's returns are serialized
        on another thread, which names them by the running task instead)."""
        @functools.wraps(fn)
        def _make_actor_method_executor(manager, method_name, *args, **kwargs):
            run = fn(manager, method_name, *args, **kwargs)
            if internal(method_name):
                def internal_executor(__ray_actor, *call_args, **call_kwargs):
                    # Its return is Ray's own (__ray_ready__'s True): not measured, and not
                    # named for the method this thread ran before it.
                    _local.method = INTERNAL
                    return run(__ray_actor, *call_args, **call_kwargs)
                internal_executor.__dict__.update(run.__dict__)
                return internal_executor

            def actor_method_executor(__ray_actor, *call_args, **call_kwargs):
                _local.method = None
                meter = self.meter()
                if meter is not None:
                    _local.method = self._safely(
                        meter.methods.label, type(__ray_actor).__name__,
                        carried(method_name, call_args))
                    pending, _local.args = getattr(_local, "args", None), None
                    if pending is not None:
                        self._safely(self._args_done, meter, _local.method, pending)
                return run(__ray_actor, *call_args, **call_kwargs)
            actor_method_executor.__dict__.update(run.__dict__)  # name, method: Ray reads them
            return actor_method_executor
        return _make_actor_method_executor

    @staticmethod
    def _args_done(meter, method, pending):
        """A task's arguments: their data time is their deserialization (the fetch to this
        node happens inside Ray's core before any hook, and only Ray's task events time it:
        not read), their locality what the refs the worker was handed say."""
        keys, nbytes, dt, moved = pending
        meter.record(names.RAY_ARGS, method, dt, keys, nbytes, dt, data=dt,
                     moved=moved or ((UNKNOWN, nbytes, None),))


def _args_moved(where, serialized, refs) -> tuple | None:
    """Where a task's arguments were. One passed by value travels inside the task (its ref is
    nil): local. One passed by ref was fetched to this node by Ray's core before any hook,
    and the worker's own table knows only its id (Ray 2.60: no node, no size), so it is
    unknown; only Ray's task events could tell (not read: DESIGN.md's reconciliation)."""
    values, handed = serialized[1::2], (refs or ())[1::2]
    if len(handed) != len(values):
        return None
    by_ref = [r for r in handed if r is not None and not r.is_nil()]
    looked = iter(where.places(by_ref) or () if by_ref else ())
    places = []
    for ref, entry in zip(handed, values):
        size = ray_names.stored_size(entry)
        if ref is None or ref.is_nil():
            places.append((LOCAL, size, None))
        else:
            where_, _, node = next(looked, (UNKNOWN, 0, None))
            places.append((where_, size, node))
    return split(places, sum(p[1] for p in places))
