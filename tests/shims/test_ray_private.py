"""The private names of Ray that dpobs reads (dpobs_otel/shims/ray_private.py), pinned against
the Ray installed here: each exists, takes the arguments the adapter passes through, and
answers in the shape the adapter reads. A Ray that moves one fails here first, and the
adapter then counts and times the public ops alone (tests/adapters/ray)."""
from __future__ import annotations

import inspect

import pytest

ray = pytest.importorskip("ray")

from dpobs_otel.shims import ray_private  # noqa: E402


def _parameters(name) -> list[str]:
    return list(inspect.signature(ray_private.lookup(name)).parameters)


def test_every_private_name_is_there():
    assert ray_private.missing() == []


def test_the_patched_functions_take_what_the_adapter_passes_through():
    assert _parameters(ray_private.SERIALIZE)[:2] == ["self", "value"]
    # (Ray 2.60 adds rdt_objects, which a task's arguments leave out; 2.49 has no such
    # parameter: the adapter reads it by keyword, where present)
    assert _parameters(ray_private.DESERIALIZE)[:3] == [
        "self", "serialized_objects", "object_refs"]
    assert _parameters(ray_private.ACTOR_CALL)[:3] == ["self", "args", "kwargs"]
    assert _parameters(ray_private.TASK_CALL)[:3] == ["self", "args", "kwargs"]
    assert _parameters(ray_private.METHOD_EXECUTOR)[:3] == ["self", "method_name", "method"]


def test_a_serialized_object_has_the_size_ray_stores():
    from ray._private.serialization import SerializationContext
    context = SerializationContext.__new__(SerializationContext)  # serialize reads no state
    raw = context.serialize(b"x" * 1000)  # bytes: Ray's raw path, no pickling
    assert ray_private.object_size(raw) == raw.total_bytes + len(raw.metadata) >= 1000
    assert ray_private.stored_size((b"d" * 7, b"meta", None)) == 11
    assert ray_private.stored_size((None, b"m")) == 1


def test_flattened_arguments_are_told_from_a_lone_object():
    dummy = ray_private.lookup(ray_private.DUMMY)
    assert type(dummy) is bytes
    assert ray_private.is_args([bytes(dummy), 1, "scale", 0.5])
    assert not ray_private.is_args([{"a": 1}])
    assert not ray_private.is_args([])
    assert not ray_private.is_args([1, 2])  # an even list of values is not a call's arguments


def test_outside_a_worker_no_task_and_no_actor():
    assert ray_private.in_worker() is False
    assert ray_private.process_kind() is None  # not connected: not known yet
    assert ray_private.current_task() == ""
    assert ray_private.hosted_class() == ""
    assert ray_private.referenced() is None  # not connected: no reference table to read
    # Asking started nothing (Ray's runtime context would start a local Ray here).
    assert not ray.is_initialized()
