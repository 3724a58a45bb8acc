"""Every private name of Ray that dpobs reads, in one place (DESIGN.md, "Ray's object store as
a data plane"): where Ray serializes and deserializes the objects it stores, where a call's
arguments are submitted, and how big a serialized object is. Each name is checked when the
adapter patches (`missing()`); where one is absent the adapter still counts and times every
public op (ray.put, ray.get, ray.wait) and leaves bytes, serialization time and the worker's
ops out, logged once and counted under names.COMPONENT_RAY_PRIVATE.

Why these and not others: ray.put, ray.get and ray.wait are public and patched as such, but
the bytes Ray moves are known only to its serializer, a call's arguments are serialized inside
its Cython core (which calls back into SerializationContext.serialize for each one), and a
worker deserializes a task's arguments through Worker.deserialize_objects, called from
Cython with no Python frame of Ray's in between. tests/shims/test_ray_private.py pins them.
"""
from __future__ import annotations

import importlib
import sys

# (module, attribute path) of each private name used; the patching sites first.
SERIALIZE = ("ray._private.serialization", "SerializationContext.serialize")
DESERIALIZE = ("ray._private.worker", "Worker.deserialize_objects")
ACTOR_CALL = ("ray.actor", "ActorMethod._remote")
ACTOR_CREATE = ("ray.actor", "ActorClass._remote")
TASK_CALL = ("ray.remote_function", "RemoteFunction._remote")
# Makes the function a worker calls to run each actor method (after its arguments are
# deserialized): where the worker learns which method its arguments were for.
METHOD_EXECUTOR = ("ray._private.function_manager",
                   "FunctionActorManager._make_actor_method_executor")
# The marker moved from ray._private to ray._common in later 2.x releases: either module.
DUMMY = ("ray._common.signature|ray._private.signature", "DUMMY_TYPE")
GLOBAL_WORKER = ("ray._private.worker", "global_worker")
WORKER_MODE = ("ray._private.worker", "WORKER_MODE")
NAMES = (SERIALIZE, DESERIALIZE, ACTOR_CALL, ACTOR_CREATE, TASK_CALL, METHOD_EXECUTOR, DUMMY,
         GLOBAL_WORKER, WORKER_MODE)


def lookup(name: tuple[str, str]):
    """The object a (module, dotted path) names, the first of `a|b` modules that has it;
    raises AttributeError or ImportError."""
    modules, path = name
    error = None
    for module in modules.split("|"):
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except (ImportError, AttributeError) as exc:
            error = exc
    raise error


def owner(name: tuple[str, str]):
    """(the class or module holding the last part of the path, that part's name)."""
    module, path = name
    head, _, attr = path.rpartition(".")
    return (lookup((module, head)) if head else importlib.import_module(module)), attr


def missing() -> list[str]:
    """The private names this Ray lacks (empty: everything the adapter reads is there)."""
    out = []
    for name in NAMES:
        try:
            lookup(name)
        except (ImportError, AttributeError):
            out.append(".".join(name))
    return out


# A serialized object's fields that give its size (SerializedObject's; the C op path reads
# them by these names too: adapters/ray/_fast.c).
SIZE_FIELDS = ("total_bytes", "metadata")


def object_size(serialized) -> int:
    """Ray's object size of a serialized object (data plus metadata: what
    ray.experimental.get_object_locations() reports as object_size)."""
    total, metadata = SIZE_FIELDS
    return getattr(serialized, total) + len(getattr(serialized, metadata) or b"")


def stored_size(entry) -> int:
    """The same for one (data, metadata, ...) entry Worker.deserialize_objects is handed."""
    data, metadata = entry[0], entry[1]
    return (len(data) if data is not None else 0) + (len(metadata) if metadata else 0)


def hosts_actor() -> bool:
    """Does this worker hold an actor instance (its methods then run through executors)?"""
    return bool(getattr(lookup(GLOBAL_WORKER), "actors", None))


def hosted_class() -> str:
    """The class name of the actor this worker holds ('' for none)."""
    actors = getattr(lookup(GLOBAL_WORKER), "actors", None) or {}
    return next((type(a).__name__ for a in actors.values()), "")


def connected() -> bool:
    """Has this process finished connecting to Ray (its core worker built)? Its mode is set
    earlier in ray.init, before the core worker exists."""
    return bool(getattr(lookup(GLOBAL_WORKER), "connected", False))


def in_worker() -> bool:
    """Is this process one of Ray's workers (an actor or task process), not a driver?"""
    return process_kind() == "worker"


def process_kind() -> str | None:
    """'worker' (an actor or task process), 'driver', or None while Ray is not connected
    (a process's kind never changes once it is: a caller may keep the answer)."""
    mode = getattr(lookup(GLOBAL_WORKER), "mode", None)
    if mode is None:
        return None
    return "worker" if mode == lookup(WORKER_MODE) else "driver"


def actor_class(method) -> str:
    """The class name of an ActorMethod's actor ('' where it cannot be told)."""
    actor = getattr(method, "_actor", None)
    if callable(actor) and not hasattr(actor, "_ray_actor_creation_function_descriptor"):
        actor = actor()  # older Rays hold the handle through a weak reference
    descriptor = getattr(actor, "_ray_actor_creation_function_descriptor", None)
    return getattr(descriptor, "class_name", "") or ""


def method_name(method) -> str:
    return getattr(method, "_method_name", "") or ""


def task_name(remote_function) -> str:
    fn = getattr(remote_function, "_function", None)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "") or ""


def current_task() -> str:
    """The running task's name on a worker ("Class.method" for an actor task), or ''.
    Asked only on a worker: ray.get_runtime_context() starts a local Ray in a process that
    has none."""
    try:
        if not in_worker():
            return ""
        import ray
        return ray.get_runtime_context().get_task_name() or ""
    except Exception:
        return ""


def referenced() -> set[str] | None:
    """The ids (hex) of the objects this process still holds a reference to, from its core
    worker's reference table; None where it cannot be read (nothing is then dropped)."""
    try:
        worker = lookup(GLOBAL_WORKER)
        if not worker.connected:  # no Ray in this process (yet): nothing can be told
            return None
        counts = worker.core_worker.get_all_reference_counts()
    except Exception:
        return None
    return {k.decode() if isinstance(k, bytes) else str(k) for k in counts}


def is_args(values) -> bool:
    """Are these deserialized values a task's flattened arguments? Ray flattens a call's
    arguments into pairs, (DUMMY_TYPE, value) for a positional one and (keyword, value) for
    a keyword one, and a worker deserializes the whole list at once."""
    if not values or len(values) % 2:
        return False
    dummy = lookup(DUMMY)
    return all(isinstance(v, str) or (type(v) is bytes and v == dummy) for v in values[0::2])


# -- where objects are: locality and the moment an object came to exist ----------------------
# The core worker's own table of object locations (what ray.experimental.
# get_local_object_locations reads): no RPC, about 1 us a ref. For a ref this process owns it
# follows the object (a copy pulled here adds this node); for a borrowed ref it is what the
# owner said when the ref arrived and never changes after.
LOCATIONS = ("ray._private.worker", "global_worker.core_worker.get_local_object_locations")
# ObjectRef._on_ready(callback) (Ray 2.60; absent before): callback(exc) once the object
# exists, without fetching or deserializing it (unlike .future() and _on_completed, which
# do both and so would change what the program moves: never used).
ON_READY = "_on_ready"
LOCALITY_NAMES = ("ray._private.worker.global_worker.core_worker.get_local_object_locations",
                  "ray.ObjectRef._on_ready")


def locality_missing() -> list[str]:
    """What this Ray lacks to tell where an op's objects were and when they came to exist
    (empty: nothing). Asked once Ray is connected (the core worker exists only then)."""
    out = []
    try:
        lookup(LOCATIONS)
    except (ImportError, AttributeError):
        out.append(LOCALITY_NAMES[0])
    try:
        from ray import ObjectRef
        getattr(ObjectRef, ON_READY)
    except (ImportError, AttributeError):
        out.append(LOCALITY_NAMES[1])
    return out


def locations_reader():
    """The core worker's location lookup: refs -> {ref: {node_ids, object_size, did_spill}}
    (a ref whose lookup failed is left out)."""
    return lookup(LOCATIONS)


def ref_type() -> type:
    """Ray's ObjectRef: the location lookup must be handed nothing else (Ray 2.60's
    get_local_object_locations crashes the process on a str)."""
    from ray import ObjectRef
    return ObjectRef


def on_ready(ref, callback):
    """callback(exc) once `ref`'s object exists (not fetched); returns the cancel."""
    return getattr(ref, ON_READY)(callback)


def node_id() -> str:
    """This process's Ray NodeID (hex), '' where it cannot be read."""
    try:
        node = lookup(GLOBAL_WORKER).current_node_id
        return node.hex() if node is not None else ""
    except Exception:
        return ""


def this_frame():
    """The Python frame of the function that calls this one: with caller_name(), how the
    deserializer hook tells Ray's error path from a task's arguments (Ray leaves no other
    sign of it)."""
    return sys._getframe(1)


def caller_name(frame) -> str:
    """The name of the Python function that called the one running `frame` ('' when Ray's
    Cython core called it directly): Worker.deserialize_objects is called by Ray's
    `raise_errors` when Ray reads an error to raise it, which is not a task's arguments."""
    back = frame.f_back
    return back.f_code.co_name if back is not None else ""


RAISES_ERRORS = "raise_errors"  # Ray's function that deserializes errors to raise them
