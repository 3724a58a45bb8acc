"""What an asyncio task is waiting for. CPython offers no public way to ask, so this is the
one place that reads asyncio's internals (tests/shims/test_asyncio_tasks.py pins each one):

- `Task._fut_waiter`: the future a suspended task waits on;
- `_GatheringFuture._children`: what an `asyncio.gather` waits on;
- `Future._callbacks`: (callback, context) pairs; asyncio.wait_for (3.11), asyncio.wait and
  TaskGroup wait on a private future that a callback of each awaited task releases, and that
  callback holds the future (a partial's argument, a closure cell or its object's attribute).
"""
from __future__ import annotations

import asyncio
import functools

_DEPTH = 16  # how deep a chain of tasks awaiting tasks is followed


def current_task():
    """The running task, or None outside a running event loop."""
    if asyncio._get_running_loop() is None:
        return None
    return asyncio.current_task()


def awaits(waiter, target) -> bool:
    """Is task `waiter` suspended on task `target`, directly or through gather, wait_for,
    wait, a TaskGroup or a chain of tasks awaiting tasks? A task is its own op's waiter: from
    Python 3.12, asyncio.wait_for runs a coroutine in the awaiting task itself."""
    if waiter is None or target is None:
        return False
    if waiter is target:
        return True
    return _leads_to(getattr(waiter, "_fut_waiter", None), target, _DEPTH)


def _leads_to(fut, target, depth: int) -> bool:
    if fut is None or depth <= 0:
        return False
    if fut is target:
        return True
    children = getattr(fut, "_children", None)
    if children:
        return any(_leads_to(child, target, depth - 1) for child in children)
    if isinstance(fut, asyncio.Task):
        return _leads_to(getattr(fut, "_fut_waiter", None), target, depth - 1)
    return _releases(target, fut, depth)


def _releases(task, fut, depth: int) -> bool:
    """Does a done-callback of `task` (or of a task awaiting it) release `fut`?"""
    for callback, _ctx in getattr(task, "_callbacks", None) or ():
        if any(ref is fut for ref in _held_by(callback)):
            return True
        owner = getattr(callback, "__self__", None)  # a task awaiting `task` directly
        if isinstance(owner, asyncio.Task) and owner is not task and depth > 1:
            if _releases(owner, fut, depth - 1):
                return True
    return False


def _held_by(callback) -> list:
    if isinstance(callback, functools.partial):
        return list(callback.args)
    owner = getattr(callback, "__self__", None)
    if owner is not None and hasattr(owner, "__dict__"):
        return list(vars(owner).values())
    cells = getattr(callback, "__closure__", None) or ()
    out = []
    for cell in cells:
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return out
