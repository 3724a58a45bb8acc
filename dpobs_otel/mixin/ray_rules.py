"""Ray's object store as a data plane (DESIGN.md, the section of that name): the recording
rules of Ray's ops, whose account is their own, and of Ray's node series beside them.

Ray's ops (Config.ray_ops) are never data-plane time: a ray_get blocks for the remote
method's whole run. So they are summed per op and `method` (the worker-group method a call,
its arguments, its returns and the gets of its refs belong to) and per step, never into
frac_of_step, the per-op share or the straggler's latencies (Config.data_plane_ops).

Per step: over the job's step rate, its most frequent stepper's (a single controller is the
one process that steps; SPMD ranks step together), so a method's seconds per step are what
the whole job spent in it per step, however many workers ran it.

Ray's node series (names.RAY_NODE_*, the same in Ray 2.49 and 2.60) come from the exporters
dpobs registers beside its processes (Config.ray_node_selector), one per node, with `node`
from Ray's NodeAddress. Ray's two spill series are gauges that only grow (cumulative since
the raylet started), so rate() reads them like counters, a raylet's restart as a reset.
"""
from __future__ import annotations

from .. import names as n
from .config import Config
from .render import Rule

OP = n.OP_DURATION_SERIES
SER = n.RAY_SERIALIZATION_SERIES
STEP = n.STEP_DURATION_SERIES
PROCESS = n.PROCESS_IDENTITY


def _sum_rate(c: Config, metric: str, *labels: str, where: tuple[str, ...] = ()) -> str:
    return f"sum {c.by(*labels)} (rate({c.sel(metric, *where)}[5m]))"


def job_step_rate(c: Config) -> str:
    """Steps per second of each job: its most frequent stepper's (see the module's doc)."""
    return f"max {c.by('job')} (rate({c.sel(f'{STEP}_count')}[5m]))"


def _per_step(c: Config, record: str) -> str:
    return f"{record}\n  / {c.on('job')} group_left ()\n({job_step_rate(c)} > 0)\n"


def _stepping(c: Config, metric: str, peer: str) -> str:
    """The job's rate of `metric` over the processes that also export `peer`."""
    return (f"sum {c.by('job')} (\n  rate({c.sel(metric)}[5m])\n"
            f"    and {c.on(*PROCESS)}\n  {c.sel(peer)}\n)")


def _op_rules(c: Config) -> list[Rule]:
    ray = (c.ray_ops,)
    frac = (f"{_stepping(c, f'{SER}_sum', f'{STEP}_sum')}\n"
            f"  / ({_stepping(c, f'{STEP}_sum', f'{SER}_sum')} > 0)\n")
    return [
        Rule({"record": n.JOB_OP_METHOD_SECONDS,
              "expr": _sum_rate(c, f"{OP}_sum", "job", "op", "method", where=ray)},
             "Ray's ops per method: seconds callers were blocked (a ray_get's include the remote\n"
             "method's run). Ops without a method (ray_put, ray_wait, gets of refs from\n"
             "elsewhere) carry none."),
        Rule({"record": n.JOB_OP_METHOD_DIRECTION_BYTES,
              "expr": _sum_rate(c, n.TRANSFERRED_SERIES, "job", "op", "method", "direction",
                                where=ray)},
             "Bytes as Ray's object sizes: ray_call and ray_put dispatch (write), ray_get\n"
             "collects (read); ray_args and ray_return are the workers' side of a call."),
        Rule({"record": n.JOB_OP_DIRECTION_RAY_SERIALIZATION,
              "expr": _sum_rate(c, f"{SER}_sum", "job", "op", "direction")}),
        Rule({"record": n.JOB_RAY_SERIALIZATION_FRAC_OF_STEP, "expr": frac},
             "Over the processes that run steps and serialize (a driver that steps; workers\n"
             "that serialize outside any step, and processes that step without Ray, would\n"
             "each dilute or inflate the share the steps pay)."),
        Rule({"record": n.JOB_OP_METHOD_RAY_SECONDS_PER_STEP,
              "expr": _per_step(c, n.JOB_OP_METHOD_SECONDS)},
             "Per step of the job (its step rate: its most frequent stepper's)."),
        Rule({"record": n.JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP,
              "expr": _per_step(c, n.JOB_OP_METHOD_DIRECTION_BYTES)}),
        Rule({"record": n.JOB_OP_RAY_SERIALIZATION_SHARE,
              "expr": f"sum {c.by('job', 'op')} ({n.JOB_OP_DIRECTION_RAY_SERIALIZATION})\n"
                      f"  / {c.on('job', 'op')}\n"
                      f"(sum {c.by('job', 'op')} ({n.JOB_OP_METHOD_SECONDS}) > 0)\n"},
             "The part of each Ray op's seconds spent in Ray's serializer, both directions."),
        Rule({"record": n.JOB_RAY_OWNED_BYTES,
              "expr": f"sum {c.by('job')} ({c.sel(n.RAY_OWNED_SERIES)})"},
             "Object-store bytes the job's processes put and still reference (a controller\n"
             "that holds every step's batch shows here first)."),
        Rule({"record": n.INSTANCE_RAY_OWNED_BYTES,
              "expr": f"sum {c.by(*PROCESS)} ({c.sel(n.RAY_OWNED_SERIES)})"}),
    ]


def _node_rules(c: Config) -> list[Rule]:
    node = (c.ray_node_selector,)

    def held(metric: str, *labels: str) -> str:
        return f"sum {c.by('job', 'node', *labels)} ({c.sel(metric, *node)})"
    used = held(n.RAY_NODE_STORE_USED)
    return [
        Rule({"record": n.JOB_NODE_LOCATION_RAY_STORE_BYTES,
              "expr": held(n.RAY_NODE_STORE_MEMORY, n.RAY_STORE_LOCATION)},
             "Ray's object store per node by Location: MMAP_SHM (shared memory), MMAP_DISK\n"
             "(fallback allocations on disk), SPILLED (objects spilled to external storage),\n"
             "WORKER_HEAP (small objects inlined in the workers' memory)."),
        Rule({"record": n.JOB_NODE_RAY_STORE_USED,
              "expr": f"{used}\n  / ({used}\n  + {held(n.RAY_NODE_STORE_AVAILABLE)} > 0)\n"},
             "Shared memory in use over the store's capacity (used + available).\n"
             f"{n.ALERT_RAY_STORE_FULL} reads this."),
        Rule({"record": n.JOB_NODE_RAY_SPILLED_BYTES,
              "expr": _sum_rate(c, n.RAY_NODE_SPILLED_BYTES, "job", "node",
                                where=(n.RAY_SPILLED_BYTES_MATCHER, *node))},
             "Bytes and objects each node spilled per second (Ray's cumulative spill gauges)."),
        Rule({"record": n.JOB_NODE_RAY_SPILLED_OBJECTS,
              "expr": _sum_rate(c, n.RAY_NODE_SPILLED_OBJECTS, "job", "node",
                                where=(n.RAY_SPILLED_OBJECTS_MATCHER, *node))},
             f"{n.ALERT_RAY_STORE_SPILLING} reads this."),
    ]


def ray_rules(c: Config) -> list[Rule]:
    return _op_rules(c) + _node_rules(c)
