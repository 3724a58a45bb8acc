"""Ray's object store as a data plane (DESIGN.md, the section of that name): the recording
rules of Ray's ops, whose account is their own, and of Ray's node series beside them.

Ray's ops' whole durations (Config.ray_ops) are never data-plane time: a ray_get blocks for
the remote method's whole run. So they are summed per op and `method` (the worker-group method
a call, its arguments, its returns and the gets of its refs belong to) and per step here;
only their moving-data part (dpobs_ray_data_seconds_total) joins frac_of_step, the per-op
share and the straggler's means (rules.data_plane_seconds).

Where the bytes travel: each measured process names its own Ray NodeID on
dpobs_ray_node_info{ray_node}, so a process's remote bytes (by the source's NodeID,
`from_node`) are joined to their destination through the process's identity; on one machine
several Ray nodes share 127.0.0.1 and the host's `node`, and only the NodeID tells them apart.

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
FETCH = n.RAY_FETCH_SERIES
# Fetches that pulled objects from another node: `mixed` gets pulled some of their objects,
# and their remote bytes are in the numerator of the bandwidth, so their seconds are too.
PULLED = f'{n.RAY_LOCALITY}=~"{n.RAY_REMOTE_LOCALITY}|{n.RAY_MIXED}"'


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


def at_ray_node(c: Config, per_process: str) -> str:
    """`per_process` (series carrying the process identity) with `node` set to the Ray
    NodeID the process runs on: its dpobs_ray_node_info's ray_node (value 1)."""
    joined = (f"{per_process}\n  * {c.on(*PROCESS)} group_left ({n.RAY_NODE_LABEL})\n"
              f"{c.sel(n.RAY_NODE_SERIES)}").replace("\n", "\n  ")
    return f'label_replace(\n  {joined},\n  "node", "$1", "{n.RAY_NODE_LABEL}", "(.+)"\n)'


def _hub_share(c: Config) -> str:
    """Each process's share of the job's Ray bytes, at most 1, the largest per job.

    A byte that moves between two measured processes is counted at both ends (a call's
    arguments by the caller's ray_call and the worker's ray_args, a return by ray_return and
    the getter's ray_get), so the job's bytes are half the processes' sum: a driver every
    batch passes through moves all of them (1), where its raw share of the sum would stop
    at 0.5. A process that gets its own puts counts both ends itself, hence the clamp."""
    inst = n.INSTANCE_RAY_MOVED
    share = (f"2 * {inst}\n  / {c.on('job')} group_left ()\n"
             f"(sum {c.by('job')} ({inst}) > 0)").replace("\n", "\n    ")
    return f"max {c.by('job')} (\n  clamp_max(\n    {share},\n    1\n  )\n)\n"


def _transfer_rules(c: Config) -> list[Rule]:
    """Where Ray's bytes travel (DESIGN.md "Moving data versus waiting (Ray)")."""
    remote = at_ray_node(c, f"rate({c.sel(n.RAY_REMOTE_SERIES)}[5m])").replace("\n", "\n  ")
    fetched = at_ray_node(c, f"rate({c.sel(f'{FETCH}_sum', PULLED)}[5m])").replace(
        "\n", "\n    ")
    into = f"sum {c.by('job', 'node')} ({n.JOB_FROM_NODE_NODE_RAY_REMOTE})"
    return [
        Rule({"record": n.JOB_OP_METHOD_LOCALITY_RAY_MOVED,
              "expr": _sum_rate(c, n.RAY_MOVED_SERIES, "job", "op", "method",
                                n.RAY_LOCALITY)},
             "Bytes Ray's ops moved by where each object was when the op asked: local (this\n"
             "node's store or the process), remote (pulled from another node), spilled\n"
             "(restored by the op), unknown (Ray did not tell)."),
        Rule({"record": n.JOB_FROM_NODE_NODE_RAY_REMOTE,
              "expr": f"sum {c.by('job', n.RAY_FROM_NODE, 'node')} (\n  {remote}\n)\n"},
             "Remote bytes per second from node `from_node` into node `node`, both Ray\n"
             "NodeIDs: the destination is the pulling process's own (dpobs_ray_node_info)."),
        Rule({"record": n.JOB_OP_METHOD_RAY_DATA,
              "expr": _sum_rate(c, n.RAY_DATA_SERIES, "job", "op", "method")},
             "The moving-data part of Ray's ops, seconds per second, from every process (the\n"
             "workers' without steps too): serializing, storing, fetching, deserializing."),
        Rule({"record": n.INSTANCE_RAY_MOVED,
              "expr": _sum_rate(c, n.RAY_MOVED_SERIES, *PROCESS)},
             "Bytes each process moves through Ray, every op and locality."),
        Rule({"record": n.JOB_RAY_HUB_SHARE, "expr": _hub_share(c)},
             (_hub_share.__doc__ or "").split("\n\n", 1)[1].replace("    ", "").strip()
             + f"\n{n.ALERT_RAY_HUB} reads this."),
        Rule({"record": n.JOB_NODE_RAY_FETCH_BANDWIDTH,
              "expr": f"{into}\n  / {c.on('job', 'node')}\n"
                      f"(\n  sum {c.by('job', 'node')} (\n    {fetched}\n  )\n  > 0\n)\n"},
             "Remote bytes into each node per second of the fetches that pulled them\n"
             "(locality remote or mixed): the speed of Ray's transfers into the node.\n"
             f"{n.ALERT_RAY_TRANSFER_SLOW} reads this."),
    ]


def ray_rules(c: Config) -> list[Rule]:
    return _op_rules(c) + _transfer_rules(c) + _node_rules(c)
