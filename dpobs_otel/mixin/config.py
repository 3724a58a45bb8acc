"""The mixin's one set of knobs, read by the recording rules, the alerts, the Alertmanager
routing and the dashboards alike (as kubernetes-mixin keeps `_config`), so a threshold or a
selector changed here changes every artifact that depends on it, and nothing else.

    from dpobs_otel.mixin import Config, write
    write("deploy-mine", Config(cluster_label="cluster", runbook_base_url="https://wiki/dpobs"))

or `dpobs mixin --out DIR --cluster-label cluster --runbook-base-url URL ...`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .. import names as n

# The runbook page in these docs. Without the operator's runbook_base_url an alert's
# runbook_url is the relative docs link docs/runbook.md#<alert>: a real path of the docs,
# never a made-up site (the placeholder it replaces linked nowhere).
RUNBOOK_PATH = "docs/runbook.md"
# The stand-in base URL the shipped promtool tests are written with (mixin/promtool/*.yml,
# package data, never written out as is): tree.promtool_tests swaps in the Config's links.
PROMTOOL_RUNBOOK_BASE = "https://github.com/example/dpobs-otel/blob/main"


@dataclass(frozen=True)
class Config:
    # Label matchers added to every raw-series selector, e.g. 'job=~"grpo-.*"'. Empty: every
    # dpobs_* series (the names are prefixed, so nothing else matches).
    job_selector: str = ""
    # A label that tells clusters apart on a shared central Prometheus (e.g. "cluster").
    # Empty: no such label. When set, every aggregation and every vector match keeps it.
    cluster_label: str = ""
    # Where the operator serves these docs: runbook_url = <runbook_base_url>/docs/runbook.md#
    # <lowercased alert name>. Empty (the default): the relative docs/runbook.md#<alert>.
    runbook_base_url: str = ""

    # DpobsDataPlaneDominatesStep: the job's exposed fraction of step time (the time steps
    # were blocked on the data plane; op-seconds for a synchronous job) above these.
    frac_of_step_warning: float = 0.25
    frac_of_step_critical: float = 0.5
    frac_of_step_for: str = "15m"
    # The ops whose whole duration is data-plane time (frac_of_step, the per-op share, the
    # straggler's mean latencies): not Ray's ops, whose ray_get blocks for the remote
    # method's whole run; of those only their moving-data part counts, from
    # dpobs_ray_data_seconds_total (DESIGN.md, "Moving data versus waiting (Ray)").
    data_plane_ops: str = 'op!~"ray_.*"'
    # Ray's ops, the rest (their own account: seconds and bytes per method, serialization).
    ray_ops: str = 'op=~"ray_.*"'
    # DpobsDataPlaneStraggler: a process's mean latency of an op at least `factor` x the
    # median of its role's, in a role of at least `min_processes` processes, for this long.
    straggler_factor: float = 2.0
    straggler_min_processes: int = 3
    straggler_for: str = "15m"
    # DpobsOperationErrors: failed / all calls per (job, op).
    error_ratio_warning: float = 0.01
    error_ratio_warning_for: str = "15m"
    error_ratio_critical: float = 0.05
    error_ratio_critical_for: str = "5m"
    # DpobsInstrumentationOverheadHigh: instrumentation time / data-plane time.
    overhead_info: float = 0.05
    overhead_for: str = "30m"
    # DpobsOutstandingBytesGrowing: rising for `for`, and above this floor (bytes).
    outstanding_bytes_floor: int = 1 << 30
    outstanding_for: str = "1h"
    # DpobsTargetDown.
    target_down_for: str = "5m"
    # DpobsAgentDown: a node's newest sample older than this (seconds), while another
    # node's is fresher, for this long.
    agent_stale_seconds: int = 120
    agent_down_for: str = "2m"
    # DpobsAgentDeliveryFailing: an agent queue's sends failed or were retried within the
    # window, or it is behind by more than lag seconds with samples pending, for this long.
    agent_delivery_window: str = "5m"
    agent_delivery_lag_seconds: int = 300
    agent_delivery_for: str = "10m"
    # Wire guard alerts.
    guard_all_mismatched_for: str = "15m"
    guard_failing_for: str = "5m"
    guard_blind_for: str = "15m"
    instrumentation_errors_for: str = "5m"
    # DpobsRuleEvaluationSlow: a dpobs rule group (rule_group, "<file>;<group>", matching this
    # regular expression: the mixin's rules files) whose last evaluation took longer than its
    # interval, for this long, or that missed an evaluation within the window.
    rule_groups: str = ".*dpobs-[^/;]*[.]rules[.]yml;.*"
    rule_evaluation_slow_for: str = "10m"
    rule_evaluation_missed_window: str = "10m"
    # DpobsWeightsStale: a receiver's weight version more than this many versions behind
    # the newest its job's senders completed, for this long. Async RL runs up to K versions
    # behind on purpose (set K); 1 lets a one-step-off-policy job, and the version in flight
    # of an on-policy one, pass; 0 holds an on-policy job to the sender's version.
    weights_stale_versions: int = 1
    weights_stale_for: str = "5m"
    # DpobsWeightSyncSlow: weight-sync time / step time of the processes that sync inside
    # their steps (the trainer's refit) above this, for this long.
    weight_sync_slow_frac: float = 0.25
    weight_sync_slow_for: str = "15m"
    # DpobsUnmeasuredClients: the share of a store op's calls (as the store counts them) that
    # the measured clients made, below this for this long (1 = every client measured).
    unmeasured_coverage: float = 0.95
    unmeasured_for: str = "15m"
    # Ray's own node series (object store, spilling): the label dpobs puts on the Ray
    # exporters it registers (adapters/ray/nodes.py), so no other ray_* series counts.
    ray_node_selector: str = f'{n.SOURCE_LABEL}="{n.SOURCE_RAY}"'
    # DpobsRayObjectStoreSpilling: a node spilled objects within the 5m window while the
    # job's Ray ops or steps ran, for this long (every window of it: spilling that recurs,
    # not one burst; one burst keeps the window's rate above 0 for 5m).
    ray_spilling_for: str = "10m"
    # DpobsRayObjectStoreFull: a put refused for want of room (error_type one of these
    # classes, on any Ray op, a method's RayTaskError(...) included) fires at once; a node's
    # store above `frac` of its capacity (shared memory used / used + available) for the
    # whole of `for` fires too.
    ray_store_full_errors: str = "|".join(n.RAY_STORE_FULL_ERRORS)
    ray_store_full_frac: float = 0.95
    ray_store_full_for: str = "15m"
    # DpobsRayHub: one process moves more than `share` of its job's Ray bytes (each byte
    # between two processes once: ray_rules._hub_share), in a job of at least
    # `min_processes` processes moving Ray bytes that moves at least `min_bytes` per second
    # through Ray (a hub of a few kilobytes of refs is nobody's bottleneck), for this long.
    ray_hub_share: float = 0.8
    ray_hub_min_processes: int = 4
    ray_hub_min_bytes: float = 1e7
    ray_hub_for: str = "15m"
    # DpobsRayTransferSlow: remote fetches into a Ray node run below `bandwidth` bytes per
    # second of fetching while the node pulls at least `min_bytes` per second from other
    # nodes (a few small pulls, whose fixed costs dominate, stay quiet), for this long.
    ray_transfer_slow_bandwidth: float = 1e8
    ray_transfer_slow_min_bytes: float = 1e7
    ray_transfer_slow_for: str = "15m"
    # Who waits for whom (the overview's queue row, `dpobs top`, the demo's report; verdict
    # in readback/verdict.py): the roles that put rows and the roles that read them (regular
    # expressions over the role label), consumers waiting for rows (exposed time with no op
    # in flight: exposed - busy) more than this fraction of their step time, rows older at
    # read than this many consumer steps.
    producer_roles: str = "rollout"
    consumer_roles: str = "trainer"
    queue_wait_frac: float = 0.25
    queue_age_steps: float = 1.0
    # Record the classic histogram's quantiles (and the per-bucket rates they share, the
    # costliest rule). Sites whose every Prometheus takes native histograms (2.x with
    # --enable-feature=native-histograms, or 3.x) can turn this off: the native quantiles
    # are always recorded, from one series per process and op instead of 18.
    classic_quantiles: bool = True
    # Evaluate the native quantile rules in a group of their own at this interval (e.g.
    # "1m"), not every evaluation_interval in the one recording group. Each of the three
    # rates every process's native histogram over 5m itself (Prometheus 2.42 discards a
    # recorded float-histogram rate), so they are the costliest rules left once the classic
    # quantiles are off; a 5m quantile moves little in a minute. Empty: the one group.
    native_quantile_interval: str = ""

    # -- PromQL helpers: the one place that decides how selectors and groupings look ------
    def labels(self, *names: str) -> str:
        """A grouping list: `job, op`, led by the cluster label when there is one."""
        keep = ((self.cluster_label,) if self.cluster_label else ()) + names
        return ", ".join(keep)

    def by(self, *names: str) -> str:
        return f"by ({self.labels(*names)})"

    def on(self, *names: str) -> str:
        return f"on ({self.labels(*names)})"

    def sel(self, metric: str, *matchers: str) -> str:
        """A raw series with the job selector and any extra matchers."""
        parts = [m for m in (*matchers, self.job_selector) if m]
        return f"{metric}{{{', '.join(parts)}}}" if parts else metric

    def runbook_url(self, alert: str) -> str:
        return f"{self.runbook_prefix()}{alert.lower()}"

    def runbook_prefix(self) -> str:
        """Every runbook_url up to the anchor: the operator's URL, else the relative path."""
        base = self.runbook_base_url.rstrip("/")
        return f"{base}/{RUNBOOK_PATH}#" if base else f"{RUNBOOK_PATH}#"

    def promtool_tests_apply(self) -> bool:
        """The shipped promtool tests pin the default thresholds, durations and selector;
        they hold with any cluster label (their input has none, so groupings by it add
        nothing) and any runbook base URL (the writer substitutes it)."""
        default = Config()
        return all(getattr(self, f.name) == getattr(default, f.name) for f in fields(self)
                   if f.name not in ("cluster_label", "runbook_base_url"))


DEFAULT = Config()
