"""TransferQueue's own Prometheus exporter as TransferQueue spells it: its series, their
labels, the request types they count and the knob it reads. Every tq_* name dpobs uses is
spelled here and nowhere else (they are TransferQueue's names, not dpobs's: names.py holds
those).

What the exporter is (transfer_queue/metrics.py; the same in 0.1.7-0.1.11 for everything
below, 0.1.11 adding storage diagnostics; 0.1.6 has no exporter):
  * init({"metrics": {"enabled": True, "port": 0}}) in the process that creates the
    controller starts it in the controller's process, bound to the controller's node IP; the
    endpoint ("ip:port") goes into the controller's stored config, which
    get_metrics_endpoint() reads from any process.
  * Controller requests, per op_type (the request type's value), counted as each is served:
    a counter, a histogram (buckets 1 ms to 5 s), errors, and samples (NOTIFY_DATA_UPDATE and
    CLEAR_META only: the rows they carry). HANDSHAKE and the checkpoint requests are not
    counted.
  * Storage units count their PUT_DATA, GET_DATA and CLEAR_DATA in exporters of their own,
    whose endpoints nobody is told; the controller asks every unit (GET_METRICS) each
    TQ_METRICS_COLLECT_INTERVAL seconds (10 by default) and republishes the counts and the
    mean, p50 and p99 latency as gauges. So the storage counts lag by up to an interval, and
    they are gauges (a unit that restarts starts again from 0).
  * Each loop picks the exporter up when it next reads it: the controller's before it blocks
    for the next request, so the first request it serves after the exporter starts is counted
    nowhere (in 0.1.7 also the first NOTIFY_DATA_UPDATE, served by a loop of its own); a
    storage unit's before each poll (up to 5 s; 0.1.11: 1 s).
"""
from __future__ import annotations

FIRST_RELEASE = (0, 1, 7)  # the first TransferQueue with the exporter

# -- series (the text exposition's names) ------------------------------------------------
CONTROLLER_REQUESTS = "tq_controller_request_total"  # counter, label op_type
CONTROLLER_ERRORS = "tq_controller_request_errors_total"  # counter, label op_type
CONTROLLER_SAMPLES = "tq_controller_request_samples_total"  # counter, label op_type
CONTROLLER_DURATION = "tq_controller_request_duration_seconds"  # histogram, label op_type
CONTROLLER_UPTIME = "tq_controller_uptime_seconds"  # gauge, set as each collection starts
STORAGE_REQUESTS = "tq_storage_request_ops"  # gauge, labels storage_unit_id, op_type
STORAGE_LATENCY_AVG = "tq_storage_request_latency_avg"  # gauge (s), same labels
STORAGE_LATENCY_P50 = "tq_storage_request_latency_p50"
STORAGE_LATENCY_P99 = "tq_storage_request_latency_p99"
STORAGE_ACTIVE_KEYS = "tq_storage_active_keys_total"  # gauge, label storage_unit_id
STORAGE_CAPACITY = "tq_storage_capacity_total"  # gauge; absent for an unlimited unit (0.1.9 on)
STORAGE_ARRIVALS = "tq_storage_arrivals_by_op"  # 0.1.11: on arrival, GET_METRICS included

# -- labels --------------------------------------------------------------------------------
OP_TYPE = "op_type"
STORAGE_UNIT = "storage_unit_id"

# -- the environment variable the exporter reads (in the controller's process) -------------
COLLECT_INTERVAL_ENV = "TQ_METRICS_COLLECT_INTERVAL"

# -- request types: the op_type values -------------------------------------------------------
# controller
GET_META = "GET_META"
NOTIFY_DATA_UPDATE = "NOTIFY_DATA_UPDATE"  # sent by the writer's storage manager after a put
SET_CUSTOM_META = "SET_CUSTOM_META"
GET_PARTITION_META = "GET_PARTITION_META"
MARK_CLEARING = "MARK_CLEARING"  # 0.1.10 on
CLEAR_META = "CLEAR_META"
CLEAR_PARTITION = "CLEAR_PARTITION"
GET_PRODUCTION = "GET_PRODUCTION"
GET_CONSUMPTION = "GET_CONSUMPTION"
RESET_CONSUMPTION = "RESET_CONSUMPTION"
GET_LIST_PARTITIONS = "GET_LIST_PARTITIONS"
KV_RETRIEVE_META = "KV_RETRIEVE_META"
KV_RETRIEVE_KEYS = "KV_RETRIEVE_KEYS"
KV_LIST = "KV_LIST"
# storage units (the label, not the request type's wire value, which is "PUT" / "GET")
PUT_DATA = "PUT_DATA"
GET_DATA = "GET_DATA"
CLEAR_DATA = "CLEAR_DATA"
GET_METRICS = "GET_METRICS"  # the controller's collection (and a manager's probe after a timeout)
