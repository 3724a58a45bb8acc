"""The `method` attribute of Ray ops: bounded names, and which method returned a ref.

A call's method is `Class.method` (a task: its qualified name). A dispatcher that carries the
method it runs by name (Ray's `__ray_call__(fn, ...)`, verl's fused workers'
`_fuw_execute("{role}_fwmn_{method}", ...)`, named "role.method") is named for the method it
carries. Ray's own internal methods (`__ray_ready__`, `__ray_terminate__`, ...) are not
measured. Past MAX_NAMES distinct names every new one is `other`, so the label stays bounded
whatever a job calls.

Refs: each call's returned refs are remembered (by their binary id, never the ref itself,
which would keep the object alive) up to MAX_REFS, the oldest forgotten first, so a ray.get
of them is attributed to the method that returned them.
"""
from __future__ import annotations

import threading

MAX_NAMES = 64
MAX_REFS = 1 << 16
OTHER = "other"
MIXED = "mixed"
# Dispatchers whose first argument is the method they carry.
CARRIERS = frozenset({"__ray_call__", "_fuw_execute"})
# verl's fused workers carry "{role}_fwmn_{method}": the method of the sub-worker the fused
# actor holds as its attribute `role`, so it is named "role.method" (the call the program
# made, `wg.actor.update_actor(...)`, and apart from the other roles' methods of that name).
FUSED_SEPARATOR = "_fwmn_"


def internal(name: str) -> bool:
    """Ray's own actor methods (readiness, termination...), which dpobs leaves alone."""
    return name.startswith("__ray_") and name not in CARRIERS


def carried(name: str, args) -> str:
    """The method a call of `name` with positional `args` runs."""
    if name in CARRIERS and args:
        first = args[0]
        if isinstance(first, str):
            role, fused, method = first.partition(FUSED_SEPARATOR)
            return f"{role}.{method}" if fused else first
        return getattr(first, "__name__", name)
    return name


class Methods:
    """The bounded set of method labels and the bounded map of refs to them."""

    def __init__(self, max_names: int = MAX_NAMES, max_refs: int = MAX_REFS):
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._max_names = max_names
        self._refs: dict[bytes, str] = {}
        self._max_refs = max_refs
        self.known = False  # has any call returned a ref? (a get then asks of())

    def label(self, cls: str, name: str) -> str:
        full = f"{cls}.{name}" if cls else name
        if full in self._names:
            return full
        with self._lock:
            if len(self._names) >= self._max_names:
                return OTHER
            self._names.add(full)
        return full

    def returned(self, result, method: str) -> None:
        """Remember the refs a call returned (one, a list of them, or a generator's none)."""
        refs = result if isinstance(result, (list, tuple)) else (result,)
        self.known = True
        with self._lock:
            for ref in refs:
                binary = getattr(ref, "binary", None)
                if binary is None:
                    continue
                self._refs[binary()] = method
            while len(self._refs) > self._max_refs:
                del self._refs[next(iter(self._refs))]

    def of_one(self, ref) -> str | None:
        """of((ref,)) without building a set: a ray.get of one ref is the common case, on every
        op's path."""
        binary = getattr(ref, "binary", None)
        return self._refs.get(binary()) if binary is not None else None

    def of(self, refs) -> str | None:
        """The method that returned every ref of `refs` (MIXED for several, None when no
        call of this process returned any of them)."""
        found = set()
        refs_map = self._refs
        for ref in refs:
            binary = getattr(ref, "binary", None)
            found.add(refs_map.get(binary()) if binary is not None else None)
        if found == {None}:
            return None
        return found.pop() if len(found) == 1 else MIXED
