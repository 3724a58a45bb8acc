"""The measured Ray entry points and the serializer hooks that give them bytes.

A measured op opens a frame on its thread; while it is open, Ray's serializer (called on the
same thread: ray.put and a call's argument submission serialize in the caller, ray.get
deserializes in it) adds each object's size and time to it. Outside any frame, on a worker,
the serializer's calls are the worker's side of a task: the arguments it deserializes before
the method runs (ray_args) and each return value it serializes after (ray_return); and a lone
object deserialized outside a frame is an `await ref` (ray_get, its duration the
deserialization: an ObjectRef's await cannot be hooked safely, so the time it waited is not
seen). Each wrapper calls Ray's own function with exactly the caller's arguments and returns
or raises exactly what it did; dpobs's own failures are counted under `ray` and swallowed.

Each op also records its moving-data part (locality.py): a get looks where its objects are
before Ray's get runs (on its own thread, in Ray's get's place: the same in C and in Python)
and turns that into data seconds and bytes by locality at its end; that part joins the
process's critical path as a past interval (critical.CriticalPath.add_past).
"""
from __future__ import annotations

import functools
from time import perf_counter

from ... import names
from ...shims import ray_private as ray_names
from ..instrumentation import UNBUILT
from .locality import UNKNOWN, Where
from .meter import DRAIN_AT
from .methods import carried, internal
from .worker import WorkerSide, _local

try:  # the op path in C (setup.py builds it where it can; _fast.c says why)
    from . import _fast as FAST
except ImportError:  # not built: the same path in Python, below
    FAST = None



class PyFrame:
    """What Ray's serializer did for one op on this thread: objects, their bytes, seconds.
    op None: a call dpobs does not measure (an actor's creation) whose serialization must
    not count as anything else. Made as Frame() and its fields set after: a class without
    an __init__ costs no Python call, on every op."""
    op = None
    count = nbytes = 0
    seconds = 0.0
    skip = ()  # ids of the objects Ray serializes that are not arguments


Frame = PyFrame if FAST is None else FAST.Frame


def _frame():
    return getattr(_local, "frame", None)


class Patches(WorkerSide):
    """The measured functions, each closing over Ray's own and the per-process meter."""

    def __init__(self, per_process, failed):
        # per_process.adapter() -> RayMeter, or None when dpobs is off or cannot start;
        # per_process.current: that, once built in this process, read with no call on each op
        self.per_process = per_process
        self.failed = failed  # (exc) -> None: dpobs's own failure, counted
        self._worker = None  # is this process a Ray worker? read once Ray has connected

    def meter(self):
        """This process's RayMeter (None: dpobs is off or could not start)."""
        meter = self.per_process.current
        return self.per_process.adapter() if meter is UNBUILT else meter

    # -- one measured call ------------------------------------------------------------------
    def measured(self, op, fn, entry, skip=(), method=None, started=None):
        """fn, measured as op `op`: entry(meter, result, dt, frame, args, kwargs) gives
        the account's record (RayMeter.record's arguments, in order) of a call that
        returned; one that raised is recorded as a failed `op` of `method`. `skip`: ids of
        the objects Ray serializes that are not the op's; `started`: the op's start where it
        is not fn's (a call's: see _call). Every line here runs on each Ray op, between Ray's
        own calls, where each Python call costs several times what it costs in a loop: so
        the meter is read without one and the record appended in place."""
        def failed(meter, args, kwargs, dt, frame, exc):
            self._safely(self._failed, meter, op, method, args, kwargs, dt, frame, exc)

        if FAST is not None:
            return FAST.Op(fn, op, self.per_process, UNBUILT, entry, failed, self.failed,
                           _local, DRAIN_AT, frozenset(skip) or None,
                           -1.0 if started is None else started)
        per_process, local = self.per_process, _local

        def call(*args, **kwargs):
            meter = per_process.current
            if meter is UNBUILT:
                meter = per_process.adapter()
            if meter is None:
                return fn(*args, **kwargs)
            frame = Frame()
            frame.op = op
            if skip:
                frame.skip = skip
            outer = getattr(local, "frame", None)
            local.frame = frame
            t0 = perf_counter() if started is None else started
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                local.frame = outer
                failed(meter, args, kwargs, perf_counter() - t0, frame, exc)
                raise
            dt = perf_counter() - t0
            local.frame = outer
            try:
                pending = meter.pending
                pending.append(entry(meter, result, dt, frame, args, kwargs))
                if len(pending) >= DRAIN_AT:
                    meter.drain()
            except Exception as exc:
                self.failed(exc)
            return result
        return call

    def _safely(self, fn, *args):
        """fn(*args), or None where dpobs's own fn raised (counted)."""
        try:
            return fn(*args)
        except Exception as exc:
            self.failed(exc)
            return None

    def _failed(self, meter, op, method, args, kwargs, dt, frame, exc):
        keys = 0
        if op == names.RAY_GET:  # the refs it asked for, and whose method they came from
            look, _local.look = getattr(_local, "look", None), None
            Where.cancel(look)
            refs = _refs(args, kwargs, "object_refs")
            method, keys = self._safely(meter.methods.of, refs), len(refs)
        meter.record(op, method, dt, keys, frame.nbytes, frame.seconds,
                     error=type(exc).__name__)

    # -- ray.put, ray.get, ray.wait ----------------------------------------------------------
    def put(self, fn):
        def entry(meter, ref, dt, frame, args, kwargs):
            _data_plane(meter, dt)
            return (names.RAY_PUT, None, dt, 1, frame.nbytes, frame.seconds, None,
                    ref.binary())
        return self._wrap(fn, names.RAY_PUT, entry)

    def get(self, fn):
        local, per_process, failed = _local, self.per_process, self.failed

        @functools.wraps(fn)
        def located(*args, **kwargs):
            """Ray's get, after a look at where its objects are (only inside a measured op:
            the meter is built by then)."""
            meter = per_process.current
            if meter is not None and meter is not UNBUILT:
                try:
                    local.look = meter.where.before(args[0] if args
                                                    else kwargs.get("object_refs"))
                except Exception as exc:
                    local.look = None
                    failed(exc)
            return fn(*args, **kwargs)

        def entry(meter, values, dt, frame, args, kwargs):
            look, local.look = getattr(local, "look", None), None
            if look is not None:
                data, moved = meter.where.after(look, dt, frame.nbytes, frame.seconds)
            else:
                data, moved = frame.seconds, ((UNKNOWN, frame.nbytes, None),)
            _data_plane(meter, data)
            refs = args[0] if args else kwargs.get("object_refs")
            methods, method = meter.methods, None
            if isinstance(refs, (list, tuple)):
                keys = len(refs)
                if methods.known:
                    method = self._safely(methods.of, refs)
            else:  # one ref, the common case: no call of _safely on its way
                keys = 1
                try:
                    method = methods.of_one(refs) if methods.known else None
                except Exception as exc:
                    self.failed(exc)
            return (names.RAY_GET, method, dt, keys, frame.nbytes, frame.seconds, None, None,
                    data, moved)
        return self._wrap(located, names.RAY_GET, entry, fn)

    def wait(self, fn):
        def entry(meter, result, dt, frame, args, kwargs):
            return (names.RAY_WAIT, None, dt, len(result[0]), 0, 0.0, None, None)
        return self._wrap(fn, names.RAY_WAIT, entry)

    def _wrap(self, fn, op, entry, ray_fn=None):
        """fn measured; the result carries the name and signature of Ray's own (ray_fn,
        where fn is dpobs's own around it)."""
        measured = self.measured(op, fn, entry)
        original = fn if ray_fn is None else ray_fn
        if FAST is not None:  # a function, as Ray's own is (`inspect`), around the C op
            def call(*args, **kwargs):
                return measured(*args, **kwargs)
            return functools.wraps(original)(call)
        return functools.wraps(original)(measured)

    # -- a remote call's submission ----------------------------------------------------------
    def actor_call(self, fn):
        @functools.wraps(fn)
        def _remote(method, args=None, kwargs=None, *rest, **options):
            started = perf_counter()
            meter = self.meter()
            name = ray_names.method_name(method)
            if meter is None or internal(name):  # Ray's own methods are left alone
                return fn(method, args, kwargs, *rest, **options)
            label = self._safely(lambda: meter.methods.label(ray_names.actor_class(method),
                                                             carried(name, args)))
            return self._call(fn, label, (method, args, kwargs, *rest), options, kwargs,
                              started)
        return _remote

    def task_call(self, fn):
        @functools.wraps(fn)
        def _remote(function, args=None, kwargs=None, *rest, **options):
            started = perf_counter()
            meter = self.meter()
            if meter is None:
                return fn(function, args, kwargs, *rest, **options)
            label = self._safely(lambda: meter.methods.label("", ray_names.task_name(function)))
            return self._call(fn, label, (function, args, kwargs, *rest), options, kwargs,
                              started)
        return _remote

    def _call(self, fn, label, args, options, call_kwargs, started):
        """A submission, timed from where the program's call reached dpobs: naming its method
        is work the caller waits on as part of the submission (a few us, the size of Ray's
        own submission of a call by ref), and a timer of the program's around `.remote()`
        sees it too."""
        def entry(meter, result, dt, frame, args, kwargs):
            self._safely(meter.methods.returned, result, label)
            _data_plane(meter, dt)
            return (names.RAY_CALL, label, dt, frame.count, frame.nbytes, frame.seconds,
                    None, None)
        # Ray serializes a keyword argument's name beside its value, and a marker beside each
        # positional one: neither is an argument.
        skip = frozenset(map(id, call_kwargs or ()))
        return self.measured(names.RAY_CALL, fn, entry, skip, label, started)(*args, **options)

    def unmeasured_call(self, fn):
        """An actor's creation: its arguments are not a measured op's (nor a return's)."""
        @functools.wraps(fn)
        def _remote(*args, **kwargs):
            outer, _local.frame = _frame(), Frame()
            try:
                return fn(*args, **kwargs)
            finally:
                _local.frame = outer
        return _remote

    # -- Ray's serializer --------------------------------------------------------------------
    def serialize(self, fn):
        dummy, local = ray_names.lookup(ray_names.DUMMY), _local
        if FAST is not None:
            return functools.wraps(fn)(FAST.Hook(0, fn, local, dummy, self._serialized_outside,
                                                 self.failed, ray_names.SIZE_FIELDS))

        @functools.wraps(fn)
        def serialize(context, value, *args, **kwargs):
            t0 = perf_counter()
            out = fn(context, value, *args, **kwargs)
            dt = perf_counter() - t0
            frame = getattr(local, "frame", None)
            try:
                if frame is not None:
                    if frame.op is not None and value is not dummy \
                            and not (frame.skip and id(value) in frame.skip):
                        frame.count += 1
                        frame.nbytes += ray_names.object_size(out)
                        frame.seconds += dt
                else:
                    self._serialized_outside((context, value), kwargs, out, dt)
            except Exception as exc:
                self.failed(exc)
            return out
        return serialize

    def deserialize(self, fn):
        local = _local
        if FAST is not None:
            return functools.wraps(fn)(FAST.Hook(1, fn, local, None, self._read_outside,
                                                 self.failed, ray_names.SIZE_FIELDS))

        @functools.wraps(fn)
        def deserialize_objects(worker, serialized, refs, *args, **kwargs):
            t0 = perf_counter()
            out = fn(worker, serialized, refs, *args, **kwargs)
            dt = perf_counter() - t0
            frame = getattr(local, "frame", None)
            try:
                if frame is not None:
                    if frame.op is not None:  # most often one object: no sum(map())
                        n, size = len(serialized), ray_names.stored_size
                        frame.count += n
                        frame.nbytes += size(serialized[0]) if n == 1 \
                            else sum(map(size, serialized))
                        frame.seconds += dt
                else:
                    self._read_outside((worker, serialized, refs, *args), kwargs, out, dt,
                                       ray_names.this_frame())
            except Exception as exc:
                self.failed(exc)
            return out
        return deserialize_objects

def _data_plane(meter, data: float) -> None:
    """The op's data part, just ended, onto the critical path (nothing while no step is
    open: one attribute read)."""
    critical = meter.critical
    if critical._steps and data > 0:
        end = perf_counter()
        critical.add_past(end - data, end)


def _refs(args, kwargs, name) -> list:
    refs = args[0] if args else kwargs.get(name)
    return list(refs) if isinstance(refs, (list, tuple)) else [refs]
