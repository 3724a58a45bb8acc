"""Every name the contract pins, in one place: instruments, units, buckets, ops.

The Prometheus series are what opentelemetry-exporter-prometheus derives from these
(dots -> underscores, unit suffix, `_total` on counters); shared/DESIGN.md lists both.
"""

OP_DURATION = "dpobs.client.operation.duration"
OP_ERRORS = "dpobs.client.operation.errors"
TRANSFERRED = "dpobs.client.transferred"
KEYS = "dpobs.client.keys"
ROWS_MISSING = "dpobs.client.rows.missing"
OUTSTANDING_SIZE = "dpobs.client.outstanding.size"
OUTSTANDING_KEYS = "dpobs.client.outstanding.keys"
STEP_DURATION = "dpobs.step.duration"
CODEC_DURATION = "dpobs.codec.duration"
INSTR_TIME = "dpobs.instrumentation.time"
INSTR_ERRORS = "dpobs.instrumentation.errors"
GUARD_RECORDED = "dpobs.guard.rows.recorded"
GUARD_CHECKED = "dpobs.guard.rows.checked"
GUARD_MISMATCHED = "dpobs.guard.rows.mismatched"
GUARD_UNVERIFIED = "dpobs.guard.rows.unverified"
GUARD_SKIPPED = "dpobs.guard.fields.skipped"
GUARD_FAILURES = "dpobs.guard.failures"

# Fixed bounds (seconds) so histograms add across processes.
OP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
              0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                1000.0, 2500.0)

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
CODEC_STAGES = ("pack", "unpack")
