"""asyncio_tasks.py reads asyncio's internals (no public API says what a task awaits): each
one it relies on is pinned here, so a Python that changes them fails this file first."""
from __future__ import annotations

import asyncio

from dpobs_otel.shims import asyncio_tasks


def run_probe(how: str) -> tuple[bool, bool]:
    """(does the awaiting task await the op's task, does an unrelated task) while the op's
    task sleeps, for one way of awaiting."""
    async def main():
        gate = asyncio.Event()
        me = asyncio.current_task()
        seen = {}

        async def op():
            await asyncio.sleep(0)  # let the awaiting task suspend first
            await asyncio.sleep(0)
            here = asyncio.current_task()
            seen["awaited"] = asyncio_tasks.awaits(me, here)
            seen["other"] = asyncio_tasks.awaits(bystander, here)
            return 1

        async def idle():
            await gate.wait()

        bystander = asyncio.create_task(idle())
        if how == "direct":
            await asyncio.create_task(op())
        elif how == "gather":
            await asyncio.gather(op(), asyncio.sleep(0.01))
        elif how == "wait_for":
            await asyncio.wait_for(op(), timeout=5)
        elif how == "wait":
            await asyncio.wait([asyncio.ensure_future(op())])
        elif how == "task_group":
            async with asyncio.TaskGroup() as tg:
                tg.create_task(op())
        elif how == "chain":  # the step awaits a task that awaits the op's task
            async def middle():
                return await asyncio.create_task(op())
            await asyncio.create_task(middle())
        elif how == "not_awaited":
            t = asyncio.create_task(op())
            await asyncio.sleep(0.01)
            await t
        gate.set()
        await bystander
        return seen["awaited"], seen["other"]

    return asyncio.run(main())


# asyncio.TaskGroup is Python 3.11's: the compat cells on 3.10 (roll) await every other way.
WAYS = ("direct", "gather", "wait_for", "wait") \
    + (("task_group",) if hasattr(asyncio, "TaskGroup") else ()) + ("chain",)


def test_each_way_of_awaiting_is_seen():
    for how in WAYS:
        assert run_probe(how) == (True, False), how


def test_a_task_not_awaited_is_not_seen():
    assert run_probe("not_awaited") == (False, False)


def test_the_internals_it_reads_exist():
    async def main():
        async def child():
            await asyncio.sleep(0.01)

        t = asyncio.create_task(child())
        await asyncio.sleep(0)
        assert hasattr(t, "_fut_waiter") and t._fut_waiter is not None
        g = asyncio.gather(t)
        assert list(g._children) == [t]
        assert isinstance(t._callbacks, list) and t._callbacks
        await g

    asyncio.run(main())


def test_current_task_outside_a_loop_is_none():
    assert asyncio_tasks.current_task() is None
