"""Ray's object store as a data plane (DESIGN.md, the section of that name): the overview's
row *Ray object store* and the process dashboard's drill-down by method. Where a Ray job's
dispatch and collect seconds go per worker-group method, how many bytes a step moves, what
Ray's serializer costs, and whether each node's store is full or spilling (Ray's own series,
through ray_rules.py). The runbook sections of the two Ray alerts name these panels.

Ray's node series carry `node` as Ray's NodeAddress (an IP), while dpobs's processes carry
DPOBS_NODE (the host name by default), so the node panels follow the job variable only."""
from __future__ import annotations

from .. import names as n
from .config import Config
from .panels import SECONDS_PER_SECOND, Query, matrix_panel, timeseries_panel

RI = "[$__rate_interval]"
DISPATCH = ("Dispatch: ray_call (a remote call's arguments passed by value) and ray_put; "
            "collect: ray_get (its seconds include the remote method's run); the workers' "
            "side of a call: ray_args and ray_return.")


def ray_panels(c: Config, job: str, nodes: str) -> list:
    """job, nodes: the dashboard's matchers, `{job=~"$job"}` and `{job=~"$job", node=~"$node"}`
    (dashboards._matchers); the per-process panel keeps the node (one instance on two nodes)."""
    full = (f"{n.ALERT_RAY_STORE_FULL} fires above {c.ray_store_full_frac:.0%} for "
            f"{c.ray_store_full_for}.")
    return [
        timeseries_panel(
            "Ray op seconds per step by method",
            "Seconds Ray's ops blocked their callers per step of the job, per op and "
            "worker-group method, over 5m (a step: the job's most frequent stepper's). "
            + DISPATCH + " Not data-plane time: only their moving-data part (*Ray data time by "
            "method*) counts in the fractions of step.",
            "s", Query(f"{n.JOB_OP_METHOD_RAY_SECONDS_PER_STEP}{job}",
                       "{{job}} {{op}} {{method}}"), width=8),
        timeseries_panel(
            "Ray bytes per step by method",
            "Bytes per step of the job as Ray's object sizes, per op, method and direction, "
            "over 5m. " + DISPATCH + " A batch dispatched by one process and read by its "
            "worker counts on both sides.", "bytes",
            Query(f"{n.JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP}{job}",
                  "{{job}} {{op}} {{method}} {{direction}}"), width=8),
        timeseries_panel(
            "Ray serialization: share of each op and of step time",
            "Seconds in Ray's serializer (both directions) / each Ray op's seconds, and Ray's "
            "serialization seconds / step seconds over the processes that run steps and "
            "serialize, over 5m. High on ray_put and ray_call: pickling the batch dominates "
            "the dispatch (a tensor store or Ray's tensor transport skips it).", "percentunit",
            Query(f"{n.JOB_OP_RAY_SERIALIZATION_SHARE}{job}", "{{job}} {{op}}"),
            Query(f"{n.JOB_RAY_SERIALIZATION_FRAC_OF_STEP}{job}", "{{job}} share of step time"),
            width=8),
        timeseries_panel(
            "Object store memory by location",
            "Each node's object store by Location (Ray's own gauge): MMAP_SHM in shared "
            "memory, MMAP_DISK allocated on disk when shared memory ran out, SPILLED written "
            "to the spill directory, WORKER_HEAP small objects inlined in the workers. "
            "Node: Ray's NodeAddress.", "bytes",
            Query(f"{n.JOB_NODE_LOCATION_RAY_STORE_BYTES}{job}",
                  "{{job}} {{node}} {{Location}}"), width=8),
        timeseries_panel(
            "Object store used per node",
            "Shared memory in use / the store's capacity (used + available), per node. Ray "
            "spills from 80% by default. " + full, "percentunit",
            Query(f"{n.JOB_NODE_RAY_STORE_USED}{job}", "{{job}} {{node}}"),
            max_value=1, width=8),
        timeseries_panel(
            "Spilled per node",
            "Bytes each node's store spilled to disk per second over 5m (Ray's cumulative "
            f"spill gauge). {n.ALERT_RAY_STORE_SPILLING} fires on objects spilled in every "
            f"5m window of {c.ray_spilling_for} while the job's Ray ops or steps run.", "Bps",
            Query(f"{n.JOB_NODE_RAY_SPILLED_BYTES}{job}", "{{job}} {{node}}"), width=8),
        timeseries_panel(
            "Object-store bytes owned per process",
            "Bytes in the object store each process put and still references (what a "
            "single controller holds), and the job's sum. Rising step after step: refs "
            "kept past their step.", "bytes",
            Query(f"{n.INSTANCE_RAY_OWNED_BYTES}{nodes}",
                  "{{job}} {{role}} {{rank}} {{node}} {{instance}}"),
            Query(f"{n.JOB_RAY_OWNED_BYTES}{job}", "{{job}} all processes"), width=24),
    ]


def ray_transfer_panels(c: Config, job: str) -> list:
    """The overview's row *Ray: where the bytes travel* (ray_rules._transfer_rules): which
    node pulls from which, where each method's objects were, how fast the pulls run, how
    much of the job's bytes one process carries, and Ray's data time per method. Nodes here
    are Ray NodeIDs (each process names its own), so two Ray nodes on one host differ."""
    slow = (f"{n.ALERT_RAY_TRANSFER_SLOW} fires below {c.ray_transfer_slow_bandwidth / 1e6:g} "
            f"MB/s into a node that pulls at least {c.ray_transfer_slow_min_bytes / 1e6:g} MB/s, "
            f"for {c.ray_transfer_slow_for}.")
    hub = (f"{n.ALERT_RAY_HUB} (info) fires above {c.ray_hub_share:.0%} in a job of "
           f"{c.ray_hub_min_processes}+ processes moving at least "
           f"{c.ray_hub_min_bytes / 1e6:g} MB/s through Ray, for {c.ray_hub_for}.")
    return [
        matrix_panel(
            "Ray node-to-node bytes",
            "Bytes per second pulled from one Ray node (row: from_node, the source's NodeID) "
            "into another (column: the pulling process's NodeID), over 5m, the jobs selected "
            "summed. An empty cell: nothing pulled that way.", "Bps",
            Query(f"sum by (from_node, node) ({n.JOB_FROM_NODE_NODE_RAY_REMOTE}{job})",
                  "{{from_node}} {{node}}"), rows=n.RAY_FROM_NODE, columns="node"),
        timeseries_panel(
            "Ray bytes by locality per method",
            "Bytes per second Ray's ops moved, per op and method, by where each object was "
            "when the op asked: local (this node's store or the process), remote (pulled "
            "from another node), spilled (restored from disk by the op), unknown (Ray did "
            "not tell). Put, call and return objects are local.", "Bps",
            Query(f"{n.JOB_OP_METHOD_LOCALITY_RAY_MOVED}{job}",
                  "{{job}} {{op}} {{method}} {{locality}}")),
        timeseries_panel(
            "Ray fetch bandwidth per node",
            "Remote bytes into each Ray node per second of the fetches that pulled them "
            "(locality remote or mixed), over 5m: the speed of Ray's transfers, not their "
            "volume. " + slow, "Bps",
            Query(f"{n.JOB_NODE_RAY_FETCH_BANDWIDTH}{job}", "{{job}} {{node}}"), width=8),
        timeseries_panel(
            "Ray hub share",
            "The largest share of the job's Ray bytes one process takes part in (each byte "
            "between two processes counted once): 1 for a driver every batch passes through, "
            "about 2 / processes when workers pass refs among themselves. " + hub,
            "percentunit", Query(f"{n.JOB_RAY_HUB_SHARE}{job}", "{{job}}"),
            max_value=1, width=8),
        timeseries_panel(
            "Ray data time by method",
            "Seconds per second Ray's ops spent moving data (serializing, storing, pulling, "
            "restoring, deserializing), per op and method, every process included; the wait "
            "for a producer is left out. The processes that step count it in their fraction "
            "of step.", SECONDS_PER_SECOND,
            Query(f"{n.JOB_OP_METHOD_RAY_DATA}{job}", "{{job}} {{op}} {{method}}"), width=8),
    ]


def ray_process_panels(c: Config, proc: str) -> list:
    """proc: the process dashboard's matcher (job, node, role, instance)."""
    ray = proc[:-1] + f", {c.ray_ops}}}"
    who = "{{node}} {{role}} {{instance}}"

    def rate(series: str, *labels: str) -> str:
        return f"sum by (node, role, instance, {', '.join(labels)}) (rate({series}{ray}{RI}))"
    return [
        timeseries_panel(
            "Ray op time by method", "Seconds per second this process was blocked in Ray's "
            "ops, per op and method. " + DISPATCH, SECONDS_PER_SECOND,
            Query(rate(f"{n.OP_DURATION_SERIES}_sum", "op", "method"),
                  who + " {{op}} {{method}}")),
        timeseries_panel(
            "Ray op mean time by method", "Mean seconds per call of each Ray op and method.",
            "s", Query(f"{rate(f'{n.OP_DURATION_SERIES}_sum', 'op', 'method')}\n  / "
                       f"{rate(f'{n.OP_DURATION_SERIES}_count', 'op', 'method')}",
                       who + " {{op}} {{method}}"), log_scale=True),
        timeseries_panel(
            "Ray bytes per second by method", "Bytes per second as Ray's object sizes, per "
            "op, method and direction.", "Bps",
            Query(rate(n.TRANSFERRED_SERIES, "op", "method", "direction"),
                  who + " {{op}} {{method}} {{direction}}")),
        timeseries_panel(
            "Ray serialization time by op", "Seconds per second in Ray's serializer, per op "
            "and direction (serialize on dispatch and return, deserialize on collect and "
            "arguments).", SECONDS_PER_SECOND,
            Query(rate(f"{n.RAY_SERIALIZATION_SERIES}_sum", "op", "direction"),
                  who + " {{op}} {{direction}}")),
        timeseries_panel(
            "Ray errors by method and type", "Failed Ray ops per second by op, method and "
            "exception class (ObjectStoreFullError: the store refused a put; "
            "RayTaskError(...): the method raised, counted on the getter's ray_get).", "ops",
            Query(rate(n.OP_ERRORS_SERIES, "op", "method", "error_type"),
                  who + " {{op}} {{method}} {{error_type}}")),
        timeseries_panel(
            "Object-store bytes owned", "Bytes in the object store this process put and "
            "still references.", "bytes",
            Query(f"sum by (node, role, instance) ({n.RAY_OWNED_SERIES}{proc})", who)),
    ]
