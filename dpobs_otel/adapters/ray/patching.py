"""Putting the measured functions of ops.py in place of Ray's, and taking them off again.

Each patch replaces one attribute where Ray defines it (a function of the `ray` module, a
method of a Ray class) and remembers the original, so uninstrument() leaves Ray exactly as it
was. Where a private name is missing (shims/ray_private.py) only the public ops are patched:
ray.put, ray.get and ray.wait are still counted and timed, bytes and the worker's ops left out.
"""
from __future__ import annotations

import logging

from ... import names
from ..instrumentation import MEASURED
from ...shims import ray_private
from .ops import Patches

log = logging.getLogger(__name__)


def _replace(owner, attr, make) -> callable:
    original = owner.__dict__[attr]
    measured = make(original)
    setattr(measured, MEASURED, True)  # dpobs's own, beside Ray's (its __wrapped__)
    setattr(owner, attr, measured)

    def undo():
        setattr(owner, attr, original)
    return undo


def sites(patches: Patches, lacking) -> list:
    """(owner, attribute, maker of the measured one) of every attribute dpobs replaces: the
    public ops, then, where Ray has every private name, the serializer hooks and calls."""
    import ray
    public = [(ray, "put", patches.put), (ray, "get", patches.get), (ray, "wait", patches.wait)]
    if lacking:
        return public
    return public + [(*ray_private.owner(name), make) for name, make in (
        (ray_private.SERIALIZE, patches.serialize),
        (ray_private.DESERIALIZE, patches.deserialize),
        (ray_private.ACTOR_CALL, patches.actor_call),
        (ray_private.TASK_CALL, patches.task_call),
        (ray_private.ACTOR_CREATE, patches.unmeasured_call),
        (ray_private.METHOD_EXECUTOR, patches.executor))]


def install(per_process, lacking) -> list:
    """Patch Ray (its public ops alone where `lacking` names private names it lacks);
    returns the undo of each patch."""
    def failed(exc):
        tel = per_process.telemetry()
        if tel is not None:
            tel.internal_error(names.COMPONENT_RAY, exc)

    if lacking:
        log.warning("dpobs: this Ray lacks %s: Ray ops are counted and timed, their bytes "
                    "and the workers' side left out", ", ".join(lacking))
    return [_replace(owner, attr, make)
            for owner, attr, make in sites(Patches(per_process, failed), lacking)]
