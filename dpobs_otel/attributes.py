"""The values dpobs's attributes take (ops, directions, sides, reasons, stages, localities,
components) and the histograms' bucket bounds. Split from names.py, which re-exports every one
of them, so `names.OPS` and `names.COMPONENT_GUARD` read as before: names.py spells the
series, rules and alerts, this module the label values inside them.
"""

# Fixed bounds (seconds) so histograms add across processes.
OP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
              0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                1000.0, 2500.0)
WEIGHT_SYNC_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0,
                       100.0, 250.0, 500.0)
# Weight sync: the two sides of one sync (a `side` label), and why a received tensor failed
# its check (the `reason` label of the mismatch counter).
WEIGHT_SIDES = ("send", "receive")
WEIGHT_MISMATCH_REASONS = ("value", "missing", "unexpected")

# The protocol's method -> op label. Adapters map their own method names onto these ops.
OPS = {
    "put_samples": "put",
    "get_samples": "get",
    "clear_samples": "clear",
    "list_sample_ids": "list",
    "register_partition": "register",
    "claim_meta": "claim_meta",
    "get_data": "get_data",
}
READ_OPS = frozenset({"get", "get_data"})
# Ray's object store (DESIGN.md, "Ray's object store as a data plane"): its ops share the op
# instruments; only their moving-data part is data-plane time (dpobs.ray.data), never their
# wait. Each op's direction of bytes, if it moves any; `method` is their extra attribute.
RAY_PUT, RAY_GET, RAY_WAIT = "ray_put", "ray_get", "ray_wait"
RAY_CALL, RAY_ARGS, RAY_RETURN = "ray_call", "ray_args", "ray_return"
RAY_OPS = {RAY_PUT: "write", RAY_GET: "read", RAY_WAIT: None, RAY_CALL: "write",
           RAY_ARGS: "read", RAY_RETURN: "write"}
RAY_METHOD = "method"
RAY_DIRECTIONS = ("serialize", "deserialize")
# Where a Ray op's objects were when it asked (the `locality` label; DESIGN.md): `mixed` only on
# the fetch histogram, `unknown` where Ray did not tell.
RAY_LOCAL, RAY_REMOTE_LOCALITY, RAY_SPILLED = "local", "remote", "spilled"
RAY_MIXED, RAY_UNKNOWN = "mixed", "unknown"
RAY_LOCALITIES = (RAY_LOCAL, RAY_REMOTE_LOCALITY, RAY_SPILLED, RAY_MIXED, RAY_UNKNOWN)
RAY_LOCALITY = "locality"
RAY_FROM_NODE = "from_node"  # the source's NodeID on dpobs_ray_remote_bytes_total
RAY_NODE_LABEL = "ray_node"  # this process's NodeID on dpobs_ray_node_info
RAY_FROM_NODE_LIMIT = 256  # distinct from_node values a process keeps; past it `other`
CODEC_STAGES = ("pack", "unpack")

# The `component` label of dpobs_instrumentation_errors_total (and _time_seconds_total): which
# part of dpobs failed. A failure is counted once and logged once per component per process;
# the user's call still returns the store's result and the op is still counted.
COMPONENT_CLIENT = "client"  # the instrumented client's own bookkeeping
COMPONENT_SIZING = "sizing"  # payload byte counts
COMPONENT_OCCUPANCY = "occupancy"  # outstanding keys and bytes
COMPONENT_GUARD = "guard"  # the wire guard's hooks
COMPONENT_ROW_AGE = "row_age"  # write stamps and read ages
COMPONENT_TRACE = "trace"  # spans
COMPONENT_CRITICAL_PATH = "critical_path"  # busy and exposed time of an op
COMPONENT_HISTOGRAM = "histogram"  # the op duration's fast path (shims/otel_histogram.py)
COMPONENT_RECONCILE = "reconcile"  # occupancy against the store's listing
COMPONENT_ADAPTER = "adapter"  # an adapter's own bookkeeping
COMPONENT_FILE_SD = "file_sd"  # the file_sd target file (off the op's path)
COMPONENT_WEIGHTS = "weights"  # a weight sync's bookkeeping, fingerprints and check
COMPONENT_EXPORT = "export"  # an observable's callback at collection (off the op's path)
COMPONENT_RAY = "ray"  # the Ray adapter's own bookkeeping on a Ray op's way
COMPONENT_OVERFLOW = "overflow"  # an instrument past the SDK's cardinality limit (labels.py)
# A private name of Ray not as known (shims/ray_private.py): ops counted and timed, bytes out.
COMPONENT_RAY_PRIVATE = "ray_private"
# A private name of the OpenTelemetry SDK or exporter not as known (shims/otel_sdk.py): that part
# runs on the public API (the native op-duration family absent, if it is that one).
OTEL_SDK_COMPONENT = "otel_sdk"
OP_PATH_COMPONENTS = (COMPONENT_SIZING, COMPONENT_OCCUPANCY, COMPONENT_GUARD, COMPONENT_ROW_AGE,
                      COMPONENT_TRACE, COMPONENT_CRITICAL_PATH, COMPONENT_HISTOGRAM,
                      COMPONENT_RECONCILE)
