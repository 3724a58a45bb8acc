"""The overview's weight-sync row (DESIGN.md "Weight sync"): how long a sync takes per side
and for the slowest receiver, how fast it moves bytes, what share of the trainer's step it
costs, which version each process holds, and whether the receivers hold what was sent. The
same numbers the weight alerts read, from the recording rules where there is one."""
from __future__ import annotations

from .. import names as n
from .config import Config
from .panels import Query, checked_stat, counted, stat_panel, thresholds, timeseries_panel


def weight_panels(c: Config, job: str, nodes: str) -> list:
    """job, nodes: the dashboard's matchers, `{job=~"$job"}` and `{job=~"$job", node=~"$node"}`
    (dashboards._matchers); the per-process panel keeps the node (one instance on two nodes)."""
    share = c.weight_sync_slow_frac
    return [
        timeseries_panel(
            "Weight sync time: mean per side and the slowest receiver",
            "Mean wall time of one weight sync over 5m, first tensor to last, on each side "
            "(send: the trainer; receive: the inference workers), and the mean of the slowest "
            "receiver: every receiver must finish before rollouts resume.", "s",
            Query(f"{n.JOB_SIDE_WEIGHTS_SYNC_MEAN}{job}", "{{job}} {{side}} mean"),
            Query(f"{n.JOB_WEIGHTS_SYNC_MAX_MEAN}{job}", "{{job}} slowest receiver"),
            width=8),
        timeseries_panel(
            "Weight sync bandwidth per side",
            "Weight bytes moved per second of syncing (not of wall time), per side over 5m: "
            "the speed the transport reached. Compare it with the link's.", "Bps",
            Query(f"{n.JOB_SIDE_WEIGHTS_BANDWIDTH}{job}", "{{job}} {{side}}"), width=8),
        stat_panel(
            "Weight sync share of step (now)",
            "Weight-sync time inside steps / step time over 5m, over the processes that sync "
            "inside their steps (the trainer's refit); rollout workers' steps do not dilute "
            f"it. Yellow at {share * 100:g}%, as {n.ALERT_WEIGHT_SYNC_SLOW}.", "percentunit",
            Query(f"{n.JOB_WEIGHT_SYNC_FRAC_OF_STEP}{job}", "{{job}}"),
            steps=thresholds((None, "green"), (share, "yellow")), width=8, height=8),
        timeseries_panel(
            "Weight versions per process: sender and receivers",
            "The version (trainer step) of each process's last completed sync, per side. "
            "Receivers' lines should follow the sender's; one that stays flat is stale "
            f"({n.ALERT_WEIGHTS_STALE} past {c.weights_stale_versions} version(s) behind).",
            "short",
            Query(f"{n.WEIGHTS_VERSION_SERIES}{nodes}",
                  "{{job}} {{side}} {{role}} {{rank}} {{node}} {{instance}}")),
        checked_stat(
            "Weights: tensors checked",
            "Weight tensors the receivers checked against the sender's fingerprints over the "
            "interval (guard on).", Query(counted(n.WEIGHTS_CHECKED_SERIES, job), "{{job}}")),
        checked_stat(
            "Weights: tensors mismatched by reason",
            "Received weight tensors that failed the check, by reason: value (differs from "
            "what was sent), missing (sent, not received), unexpected (received, not sent). "
            f"Any is an incident ({n.ALERT_WEIGHTS_MISMATCH}); zero only means clean if "
            "tensors checked is non-zero.",
            Query(counted(n.WEIGHTS_MISMATCHED_SERIES, job, "reason"), "{{job}} {{reason}}"),
            color="red"),
    ]
