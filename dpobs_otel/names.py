"""Every name the contract pins (shared/DESIGN.md), each spelled once: the OpenTelemetry
instruments (with the table of their kinds, units and descriptions), the Prometheus series
they become, the recording rules, the alerts, and the labels that identify a process. Everything else imports them from here, so a name changed
here changes in the rules, alerts, dashboards, `dpobs top`, `dpobs compare` and the report
alike; tests/test_names.py fails on a copy spelled out anywhere else.
"""
from typing import NamedTuple

# -- OpenTelemetry instruments ------------------------------------------------------------
OP_DURATION = "dpobs.client.operation.duration"
OP_DURATION_NATIVE = "dpobs.client.operation.duration.native"  # its exponential View
OP_ERRORS = "dpobs.client.operation.errors"
TRANSFERRED = "dpobs.client.transferred"
KEYS = "dpobs.client.keys"
ROWS_MISSING = "dpobs.client.rows.missing"
OUTSTANDING_SIZE = "dpobs.client.outstanding.size"
OUTSTANDING_KEYS = "dpobs.client.outstanding.keys"
STEP_DURATION = "dpobs.step.duration"
STEP_BUSY = "dpobs.step.data_plane.busy"
STEP_EXPOSED = "dpobs.step.data_plane.exposed"
ROW_AGE = "dpobs.client.row.age"
ROWS_UNSTAMPED = "dpobs.client.rows.unstamped"
CODEC_DURATION = "dpobs.codec.duration"
INSTR_TIME = "dpobs.instrumentation.time"
INSTR_ERRORS = "dpobs.instrumentation.errors"
GUARD_RECORDED = "dpobs.guard.rows.recorded"
GUARD_CHECKED = "dpobs.guard.rows.checked"
GUARD_MISMATCHED = "dpobs.guard.rows.mismatched"
GUARD_UNVERIFIED = "dpobs.guard.rows.unverified"
GUARD_SKIPPED = "dpobs.guard.fields.skipped"
GUARD_FAILURES = "dpobs.guard.failures"
WEIGHTS_SYNC_DURATION = "dpobs.weights.sync.duration"
WEIGHTS_TRANSFERRED = "dpobs.weights.transferred"
WEIGHTS_TENSORS = "dpobs.weights.tensors"
WEIGHTS_VERSION = "dpobs.weights.version"
WEIGHTS_CHECKED = "dpobs.weights.tensors.checked"
WEIGHTS_MISMATCHED = "dpobs.weights.tensors.mismatched"
STEP_WEIGHT_SYNC = "dpobs.step.weight_sync"
RAY_SERIALIZATION = "dpobs.ray.serialization.duration"
# DESIGN.md names the instrument dpobs.ray.owned.size and its series dpobs_ray_owned_bytes; the
# exporter would serve dpobs_ray_owned_size_bytes for the former, so the instrument is named
# for the series users query.
RAY_OWNED = "dpobs.ray.owned"
# Moving data apart from waiting (DESIGN.md "Moving data versus waiting (Ray)").
RAY_FETCH = "dpobs.ray.fetch.duration"
RAY_MOVED = "dpobs.ray.moved"
RAY_REMOTE = "dpobs.ray.remote"
# DESIGN.md's dpobs.ray.data.duration and dpobs.ray.node would be served as
# dpobs_ray_data_duration_seconds_total and dpobs_ray_node; as with RAY_OWNED, the instruments
# are named for the series DESIGN.md pins (dpobs_ray_data_seconds_total, dpobs_ray_node_info).
RAY_DATA = "dpobs.ray.data"
RAY_NODE = "dpobs.ray.node.info"


# Every instrument dpobs creates, one row each: its kind and unit are written here alone; the
# series below derive from them, and instruments.py creates each instrument from its row.
HISTOGRAM = "histogram"
OBSERVABLE_COUNTER = "observable_counter"  # monotonic: its series ends in _total
OBSERVABLE_UP_DOWN_COUNTER = "observable_up_down_counter"
OBSERVABLE_GAUGE = "observable_gauge"


class Instrument(NamedTuple):
    name: str
    kind: str
    unit: str
    description: str


INSTRUMENTS = {row.name: row for row in (
    # The core (telemetry.py; its callbacks in observed.py).
    Instrument(OP_DURATION, HISTOGRAM, "s",
               "Data-plane operation time, failures included"),
    Instrument(STEP_DURATION, HISTOGRAM, "s",
               "Training step time"),
    Instrument(CODEC_DURATION, HISTOGRAM, "s",
               "Codec work outside the client"),
    Instrument(OP_ERRORS, OBSERVABLE_COUNTER, "{error}",
               "Failed data-plane operations, by exception class"),
    Instrument(TRANSFERRED, OBSERVABLE_COUNTER, "By",
               "Payload bytes moved, by direction"),
    Instrument(KEYS, OBSERVABLE_COUNTER, "{key}",
               "Sample ids named by operations"),
    Instrument(ROWS_MISSING, OBSERVABLE_COUNTER, "{row}",
               "Rows a read asked for and did not get back"),
    Instrument(OUTSTANDING_SIZE, OBSERVABLE_UP_DOWN_COUNTER, "By",
               "Payload bytes put and not yet cleared"),
    Instrument(OUTSTANDING_KEYS, OBSERVABLE_UP_DOWN_COUNTER, "{key}",
               "Keys put and not yet cleared"),
    Instrument(STEP_BUSY, OBSERVABLE_COUNTER, "s",
               "Step time with a data-plane op of this process in flight"),
    Instrument(STEP_EXPOSED, OBSERVABLE_COUNTER, "s",
               "Step time a step's own thread or task was blocked on the data plane"),
    Instrument(INSTR_TIME, OBSERVABLE_COUNTER, "s",
               "Time spent by dpobs itself, by component"),
    Instrument(INSTR_ERRORS, OBSERVABLE_COUNTER, "{error}",
               "Internal errors dpobs swallowed, by component"),
    # Row age (rowage.py).
    Instrument(ROW_AGE, HISTOGRAM, "s",
               "Time from a row's put to its read"),
    Instrument(ROWS_UNSTAMPED, OBSERVABLE_COUNTER, "{row}",
               "Rows read without a usable write stamp, by reason"),
    # The wire guard (guard/counts.py).
    Instrument(GUARD_RECORDED, OBSERVABLE_COUNTER, "{row}",
               "Rows given a wire fingerprint at put, per field"),
    Instrument(GUARD_CHECKED, OBSERVABLE_COUNTER, "{row}",
               "Rows whose wire fingerprint was recomputed and compared at get, per field"),
    Instrument(GUARD_MISMATCHED, OBSERVABLE_COUNTER, "{row}",
               "Checked rows whose wire fingerprint differed from the writer's, per field"),
    Instrument(GUARD_UNVERIFIED, OBSERVABLE_COUNTER, "{row}",
               "Rows read back without a usable wire fingerprint, per field"),
    Instrument(GUARD_SKIPPED, OBSERVABLE_COUNTER, "{field}",
               "Fields the wire guard could not fingerprint or compare, per reason"),
    Instrument(GUARD_FAILURES, OBSERVABLE_COUNTER, "{error}",
               "Exceptions raised inside the wire guard (swallowed), per error type"),
    # Weight sync (weights/meter.py).
    Instrument(WEIGHTS_SYNC_DURATION, HISTOGRAM, "s",
               "One weight sync, one side: first tensor to last"),
    Instrument(WEIGHTS_TRANSFERRED, OBSERVABLE_COUNTER, "By",
               "Weight payload bytes moved, by side"),
    Instrument(WEIGHTS_TENSORS, OBSERVABLE_COUNTER, "{tensor}",
               "Weight tensors moved, by side"),
    Instrument(WEIGHTS_VERSION, OBSERVABLE_GAUGE, "{version}",
               "Version (trainer step) of the last completed sync"),
    Instrument(WEIGHTS_CHECKED, OBSERVABLE_COUNTER, "{tensor}",
               "Received weight tensors checked against the sender's"),
    Instrument(WEIGHTS_MISMATCHED, OBSERVABLE_COUNTER, "{tensor}",
               "Weight tensors that failed the check, by reason"),
    Instrument(STEP_WEIGHT_SYNC, OBSERVABLE_COUNTER, "s",
               "Weight-sync time inside a step, on its thread"),
    # Ray's object store (adapters/ray/meter.py); its ops use the core's op instruments.
    Instrument(RAY_SERIALIZATION, HISTOGRAM, "s",
               "Time a Ray op spent in Ray's serializer, by direction"),
    Instrument(RAY_OWNED, OBSERVABLE_UP_DOWN_COUNTER, "By",
               "Object-store bytes this process put and still references"),
    Instrument(RAY_FETCH, HISTOGRAM, "s",
               "A Ray op's fetch and deserialization of objects that existed, by locality"),
    Instrument(RAY_MOVED, OBSERVABLE_COUNTER, "By",
               "Bytes of the objects a Ray op moved, by where they were"),
    Instrument(RAY_REMOTE, OBSERVABLE_COUNTER, "By",
               "Bytes a Ray op pulled from another node, by the source's NodeID"),
    Instrument(RAY_DATA, OBSERVABLE_COUNTER, "s",
               "The moving-data part of Ray ops' time (never the wait for a producer)"),
    Instrument(RAY_NODE, OBSERVABLE_GAUGE, "1",
               "1, naming the Ray NodeID this process runs on"),
)}
# A View that makes a second family of an instrument: the op duration's exponential one.
VIEWS = {OP_DURATION_NATIVE: OP_DURATION}


# -- Prometheus series --------------------------------------------------------------------
# Derived from the instruments' rows, not spelled again: tests/test_names.py checks the
# derivation against a real /metrics scrape, so an exporter that names things differently
# fails there first.
_UNIT_WORDS = {"s": "seconds", "By": "bytes"}  # the exporter's map_unit; {row} etc. add none


def series(instrument: str, unit: str, counter: bool = False) -> str:
    """The series opentelemetry-exporter-prometheus serves for an instrument: dots become
    underscores, the unit's word is appended, and a monotonic counter ends in `_total`.
    A histogram's series add `_bucket`, `_sum` and `_count` to this name."""
    name = instrument.replace(".", "_")
    word = _UNIT_WORDS.get(unit, "")
    if word and not name.endswith("_" + word):
        name += "_" + word
    return name + "_total" if counter else name


def instrument_series(name: str) -> str:
    """The series of an instrument (or View) of INSTRUMENTS, from its row's unit and kind."""
    row = INSTRUMENTS[VIEWS.get(name, name)]
    return series(name, row.unit, counter=row.kind == OBSERVABLE_COUNTER)


OP_DURATION_SERIES = instrument_series(OP_DURATION)
OP_DURATION_NATIVE_SERIES = instrument_series(OP_DURATION_NATIVE)
OP_ERRORS_SERIES = instrument_series(OP_ERRORS)
TRANSFERRED_SERIES = instrument_series(TRANSFERRED)
KEYS_SERIES = instrument_series(KEYS)
ROWS_MISSING_SERIES = instrument_series(ROWS_MISSING)
OUTSTANDING_SIZE_SERIES = instrument_series(OUTSTANDING_SIZE)
OUTSTANDING_KEYS_SERIES = instrument_series(OUTSTANDING_KEYS)
STEP_DURATION_SERIES = instrument_series(STEP_DURATION)
STEP_BUSY_SERIES = instrument_series(STEP_BUSY)
STEP_EXPOSED_SERIES = instrument_series(STEP_EXPOSED)
ROW_AGE_SERIES = instrument_series(ROW_AGE)
ROWS_UNSTAMPED_SERIES = instrument_series(ROWS_UNSTAMPED)
CODEC_DURATION_SERIES = instrument_series(CODEC_DURATION)
INSTR_TIME_SERIES = instrument_series(INSTR_TIME)
INSTR_ERRORS_SERIES = instrument_series(INSTR_ERRORS)
GUARD_RECORDED_SERIES = instrument_series(GUARD_RECORDED)
GUARD_CHECKED_SERIES = instrument_series(GUARD_CHECKED)
GUARD_MISMATCHED_SERIES = instrument_series(GUARD_MISMATCHED)
GUARD_UNVERIFIED_SERIES = instrument_series(GUARD_UNVERIFIED)
GUARD_SKIPPED_SERIES = instrument_series(GUARD_SKIPPED)
GUARD_FAILURES_SERIES = instrument_series(GUARD_FAILURES)
WEIGHTS_SYNC_DURATION_SERIES = instrument_series(WEIGHTS_SYNC_DURATION)
WEIGHTS_TRANSFERRED_SERIES = instrument_series(WEIGHTS_TRANSFERRED)
WEIGHTS_TENSORS_SERIES = instrument_series(WEIGHTS_TENSORS)
WEIGHTS_VERSION_SERIES = instrument_series(WEIGHTS_VERSION)
WEIGHTS_CHECKED_SERIES = instrument_series(WEIGHTS_CHECKED)
WEIGHTS_MISMATCHED_SERIES = instrument_series(WEIGHTS_MISMATCHED)
STEP_WEIGHT_SYNC_SERIES = instrument_series(STEP_WEIGHT_SYNC)
RAY_SERIALIZATION_SERIES = instrument_series(RAY_SERIALIZATION)
RAY_OWNED_SERIES = instrument_series(RAY_OWNED)
RAY_FETCH_SERIES = instrument_series(RAY_FETCH)
RAY_MOVED_SERIES = instrument_series(RAY_MOVED)
RAY_REMOTE_SERIES = instrument_series(RAY_REMOTE)
RAY_DATA_SERIES = instrument_series(RAY_DATA)
RAY_NODE_SERIES = instrument_series(RAY_NODE)


# -- The process identity -----------------------------------------------------------------
# Two processes on different nodes may publish the same host:port, so instance alone does
# not name a process (DESIGN.md "Cluster deployment"); the agent adds node, file_sd adds
# job, role and rank. Per-process rules group by exactly these.
PROCESS_IDENTITY = ("job", "node", "instance", "role", "rank")
# The role of a store's own exporter registered beside the processes (TransferQueue's
# controller, adapters/transferqueue/store_metrics.py): a target of the job that is not a
# dpobs process, so the readers of dpobs's numbers (cluster view, top, timeline) skip it.
ROLE_TQ_CONTROLLER = "tq-controller"
# Ray's own exporter on each node (its metrics export port: object store memory by location,
# spilling, pulls), registered by a Ray driver beside its processes (adapters/ray/nodes.py)
# with labels job, role ray-node, node (Ray's NodeAddress) and dpobs_source="ray", the
# selector of the rules that read Ray's series. Not a dpobs process either.
ROLE_RAY_NODE = "ray-node"
SOURCE_LABEL = "dpobs_source"
SOURCE_RAY = "ray"
STORE_ROLES = frozenset({ROLE_TQ_CONTROLLER, ROLE_RAY_NODE})
# Ray's node series the rules read (what its raylet exports on the node's metrics export
# port; not dpobs's, hence no _SERIES suffix): the same names and labels in Ray 2.49.2
# (NeMo-RL's pin, OpenCensus export) and 2.60 (OpenTelemetry export), both scraped live. Ray
# serves that port from its agent, which needs ray[default]'s dependencies (a bare `pip
# install ray` 2.49 listens on none). Every one a gauge, the two spill ones cumulative since
# the raylet started (rate() takes them like counters).
RAY_NODE_STORE_MEMORY = "ray_object_store_memory"  # bytes by Location (below)
RAY_STORE_LOCATION = "Location"
RAY_STORE_LOCATIONS = ("MMAP_SHM", "MMAP_DISK", "SPILLED", "WORKER_HEAP")
RAY_NODE_STORE_USED = "ray_object_store_used_memory"  # shared memory in use
RAY_NODE_STORE_AVAILABLE = "ray_object_store_available_memory"  # used + available = capacity
RAY_NODE_SPILLED_BYTES = "ray_spill_manager_objects_bytes"  # State="Spilled": bytes spilled
RAY_NODE_SPILLED_OBJECTS = "ray_spill_manager_request_total"  # Type="Spilled": objects
RAY_SPILLED_BYTES_MATCHER = 'State="Spilled"'
RAY_SPILLED_OBJECTS_MATCHER = 'Type="Spilled"'
# The exception classes of a put Ray refused for want of room (error_type of a Ray op, as
# Python names the class; a method's shows as RayTaskError(<class>) on the getter's ray_get).
RAY_STORE_FULL_ERRORS = ("ObjectStoreFullError", "OutOfDiskError")


# -- Recording rules (level:metric:operations; DESIGN.md "Recording rules") ---------------
# Spelled out rather than assembled, so a grep for a name a dashboard shows lands here.
JOB_ROLE_OP_SECONDS = "job_role_op:dpobs_client_operation_duration_seconds:rate5m"
JOB_OP_SECONDS = "job_op:dpobs_client_operation_duration_seconds:rate5m"
JOB_SECONDS = "job:dpobs_client_operation_duration_seconds:rate5m"
JOB_STEP_SECONDS = "job:dpobs_step_duration_seconds:rate5m"
# Fractions of step time: data-plane (op-seconds), busy and exposed wall time.
JOB_FRAC_OF_STEP = "job:dpobs_frac_of_step:ratio_rate5m"
INSTANCE_FRAC_OF_STEP = "instance:dpobs_frac_of_step:ratio_rate5m"
JOB_MAX_FRAC_OF_STEP = "job:dpobs_frac_of_step:max_ratio_rate5m"
JOB_BUSY_FRAC_OF_STEP = "job:dpobs_busy_frac_of_step:ratio_rate5m"
INSTANCE_BUSY_FRAC_OF_STEP = "instance:dpobs_busy_frac_of_step:ratio_rate5m"
JOB_EXPOSED_FRAC_OF_STEP = "job:dpobs_exposed_frac_of_step:ratio_rate5m"
INSTANCE_EXPOSED_FRAC_OF_STEP = "instance:dpobs_exposed_frac_of_step:ratio_rate5m"
JOB_MAX_EXPOSED_FRAC_OF_STEP = "job:dpobs_exposed_frac_of_step:max_ratio_rate5m"
# Per op: share, rate, latency.
JOB_OP_SHARE = "job_op:dpobs_operation_share:ratio_rate5m"
JOB_OP_RATE = "job_op:dpobs_client_operations:rate5m"
JOB_OP_MEAN = "job_op:dpobs_client_operation_duration_seconds:mean_rate5m"
JOB_OP_QUANTILE = "job_op:dpobs_client_operation_duration_seconds:quantile_rate5m"
JOB_OP_NATIVE_QUANTILE = "job_op:dpobs_client_operation_duration_native_seconds:quantile_rate5m"
INSTANCE_OP_MEAN = "instance_op:dpobs_client_operation_duration_seconds:mean_rate5m"
# Not pinned: the bucket rates the three quantiles share (recorded once, most of their cost).
JOB_OP_LE_BUCKETS = "job_op_le:dpobs_client_operation_duration_seconds_bucket:rate5m"
QUANTILES = ("0.5", "0.9", "0.99")  # values of the quantile label
# Not pinned: the node tier's parts (mixin/node_tier.py). A node's part of a job-level
# record is that record's name behind NODE_PART; two parts no record holds on its own:
NODE_PART = "node_"
NODE_ROW_AGE_BUCKETS = "node_job_op_le:dpobs_client_row_age_seconds_bucket:rate5m"
NODE_STEPPING_SECONDS = "node_job:dpobs_stepping_data_plane_seconds:rate5m"
# Row age.
JOB_OP_ROW_AGE_MEAN = "job_op:dpobs_client_row_age_seconds:mean_rate5m"
JOB_OP_ROW_AGE_QUANTILE = "job_op:dpobs_client_row_age_seconds:quantile_rate5m"
ROW_AGE_QUANTILES = ("0.5", "0.99")
# Volume, errors, occupancy, cost.
JOB_OP_DIRECTION_BYTES = "job_op_direction:dpobs_client_transferred_bytes:rate5m"
JOB_OP_ERROR_RATIO = "job_op:dpobs_client_operation_errors_per_operations:ratio_rate5m"
JOB_OUTSTANDING_BYTES = "job:dpobs_client_outstanding_size_bytes:sum"
JOB_STAGE_CODEC_SECONDS = "job_stage:dpobs_codec_duration_seconds:rate5m"
JOB_OVERHEAD_RATIO = "job:dpobs_instrumentation_time_per_operation_time:ratio_rate5m"
# Wire guard.
JOB_GUARD_CHECKED = "job:dpobs_guard_rows_checked:increase5m"
JOB_GUARD_MISMATCHED = "job:dpobs_guard_rows_mismatched:increase5m"
# Weight sync.
JOB_SIDE_WEIGHTS_SYNC_MEAN = "job_side:dpobs_weights_sync_duration_seconds:mean_rate5m"
JOB_SIDE_WEIGHTS_BANDWIDTH = "job_side:dpobs_weights_sync_bandwidth_bytes:ratio_rate5m"
JOB_WEIGHTS_SYNC_MAX_MEAN = "job:dpobs_weights_sync_duration_seconds:max_mean_rate5m"
JOB_WEIGHT_SYNC_FRAC_OF_STEP = "job:dpobs_weight_sync_frac_of_step:ratio_rate5m"
# The store's own account beside dpobs's (TransferQueue's exporter, whose series
# adapters/transferqueue/exporter.py spells; the request mapping is requests.py's).
JOB_OP_STORE_SERVER_SECONDS = "job_op:dpobs_store_server_seconds:rate5m"
JOB_OP_STORE_SERVER_SHARE = "job_op:dpobs_store_server_share:ratio_rate5m"
JOB_OP_STORE_COVERAGE = "job_op:dpobs_store_coverage:ratio_rate5m"
# Not pinned: their inputs, and the job's coverage over every op it covers.
UNIT_STORE_SECONDS = "storage_unit_op_type:dpobs_store_request_seconds:avg_times_ops"
JOB_OP_TYPE_STORE_SECONDS = "job_op_type:dpobs_store_request_seconds:rate5m"
JOB_OP_TYPE_STORE_REQUESTS = "job_op_type:dpobs_store_requests:rate5m"
JOB_OP_TYPE_STORE_MEAN = "job_op_type:dpobs_store_request_seconds:mean_rate5m"
JOB_OP_STORE_MADE = "job_op:dpobs_store_requests_made:rate5m"
JOB_OP_STORE_SERVED = "job_op:dpobs_store_requests_served:rate5m"
JOB_STORE_COVERAGE = "job:dpobs_store_coverage:ratio_rate5m"
# Ray's object store as a data plane: its ops' own account (out of data-plane time).
JOB_OP_METHOD_SECONDS = "job_op_method:dpobs_client_operation_duration_seconds:rate5m"
JOB_OP_METHOD_DIRECTION_BYTES = "job_op_method_direction:dpobs_client_transferred_bytes:rate5m"
JOB_OP_DIRECTION_RAY_SERIALIZATION = (
    "job_op_direction:dpobs_ray_serialization_duration_seconds:rate5m")
JOB_RAY_SERIALIZATION_FRAC_OF_STEP = "job:dpobs_ray_serialization_frac_of_step:ratio_rate5m"
JOB_OP_METHOD_LOCALITY_RAY_MOVED = "job_op_method_locality:dpobs_ray_moved_bytes:rate5m"
JOB_FROM_NODE_NODE_RAY_REMOTE = "job_from_node_node:dpobs_ray_remote_bytes:rate5m"
JOB_OP_METHOD_RAY_DATA = "job_op_method:dpobs_ray_data_seconds:rate5m"
INSTANCE_RAY_MOVED = "instance:dpobs_ray_moved_bytes:rate5m"
JOB_RAY_HUB_SHARE = "job:dpobs_ray_hub_share:max_ratio_rate5m"
JOB_NODE_RAY_FETCH_BANDWIDTH = "job_node:dpobs_ray_fetch_bandwidth_bytes:ratio_rate5m"
# Not pinned: the Ray row's readers (per step, serialization's share, the nodes' stores).
JOB_OP_METHOD_RAY_SECONDS_PER_STEP = "job_op_method:dpobs_ray_seconds_per_step:ratio_rate5m"
JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP = (
    "job_op_method_direction:dpobs_ray_bytes_per_step:ratio_rate5m")
JOB_OP_RAY_SERIALIZATION_SHARE = "job_op:dpobs_ray_serialization_share:ratio_rate5m"
JOB_RAY_OWNED_BYTES = "job:dpobs_ray_owned_bytes:sum"
INSTANCE_RAY_OWNED_BYTES = "instance:dpobs_ray_owned_bytes:sum"
JOB_NODE_LOCATION_RAY_STORE_BYTES = "job_node_location:dpobs_ray_object_store_bytes:sum"
JOB_NODE_RAY_STORE_USED = "job_node:dpobs_ray_object_store_used:ratio"
JOB_NODE_RAY_SPILLED_BYTES = "job_node:dpobs_ray_spilled_bytes:rate5m"
JOB_NODE_RAY_SPILLED_OBJECTS = "job_node:dpobs_ray_spilled_objects:rate5m"
# Not pinned: when each node's agent last delivered (DpobsAgentDown reads it).
NODE_AGENT_LAST_SAMPLE = "node:dpobs_agent_last_sample_timestamp_seconds:max"
# The records DESIGN.md does not pin: inputs of pinned ones, and readers' conveniences.
UNPINNED_RECORDS = frozenset({
    JOB_OP_LE_BUCKETS, NODE_AGENT_LAST_SAMPLE, UNIT_STORE_SECONDS, JOB_OP_TYPE_STORE_SECONDS,
    JOB_OP_TYPE_STORE_REQUESTS, JOB_OP_TYPE_STORE_MEAN, JOB_OP_STORE_MADE, JOB_OP_STORE_SERVED,
    JOB_STORE_COVERAGE, JOB_OP_METHOD_RAY_SECONDS_PER_STEP,
    JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP, JOB_OP_RAY_SERIALIZATION_SHARE,
    JOB_RAY_OWNED_BYTES, INSTANCE_RAY_OWNED_BYTES, JOB_NODE_LOCATION_RAY_STORE_BYTES,
    JOB_NODE_RAY_STORE_USED, JOB_NODE_RAY_SPILLED_BYTES, JOB_NODE_RAY_SPILLED_OBJECTS,
    NODE_ROW_AGE_BUCKETS, NODE_STEPPING_SECONDS})


# -- Alerts (CamelCase, Dpobs prefix; runbook anchors are the lowercased names) ----------
ALERT_WIRE_HASH_MISMATCH = "DpobsWireHashMismatch"
ALERT_GUARD_ALL_MISMATCHED = "DpobsWireGuardAllRowsMismatched"
ALERT_GUARD_FAILING = "DpobsWireGuardFailing"
ALERT_GUARD_BLIND = "DpobsWireGuardBlind"
ALERT_DOMINATES_STEP = "DpobsDataPlaneDominatesStep"
ALERT_STRAGGLER = "DpobsDataPlaneStraggler"
ALERT_OPERATION_ERRORS = "DpobsOperationErrors"
ALERT_OUTSTANDING_GROWING = "DpobsOutstandingBytesGrowing"
ALERT_TARGET_DOWN = "DpobsTargetDown"
ALERT_AGENT_DOWN = "DpobsAgentDown"
ALERT_AGENT_DELIVERY_FAILING = "DpobsAgentDeliveryFailing"
ALERT_OVERHEAD_HIGH = "DpobsInstrumentationOverheadHigh"
ALERT_INSTRUMENTATION_ERRORS = "DpobsInstrumentationErrors"
ALERT_WEIGHTS_MISMATCH = "DpobsWeightsMismatch"
ALERT_WEIGHTS_STALE = "DpobsWeightsStale"
ALERT_WEIGHT_SYNC_SLOW = "DpobsWeightSyncSlow"
ALERT_UNMEASURED_CLIENTS = "DpobsUnmeasuredClients"
ALERT_RAY_STORE_SPILLING = "DpobsRayObjectStoreSpilling"
ALERT_RAY_STORE_FULL = "DpobsRayObjectStoreFull"
ALERT_RAY_TRANSFER_SLOW = "DpobsRayTransferSlow"
ALERT_RAY_HUB = "DpobsRayHub"
# The monitoring's own health (issue 57).
ALERT_RULE_EVALUATION_SLOW = "DpobsRuleEvaluationSlow"
ALERT_CARDINALITY_OVERFLOW = "DpobsCardinalityOverflow"


# -- Label values and bucket bounds: dpobs_otel/attributes.py, read through here as before.
from .attributes import *  # noqa: E402,F401,F403
