"""The overview's queue row: who waits for whom (readback/verdict.py says it in one line for
`dpobs top` and the demo's report; these panels show the numbers it reads). Producers and
consumers are the Config's roles (producer_roles, consumer_roles)."""
from __future__ import annotations

from .. import names as n
from .config import Config
from .panels import Query, timeseries_panel

RI = "[$__rate_interval]"


def queue_panels(c: Config, job: str, nodes: str) -> list:
    """job, nodes: the dashboard's matchers, `{job=~"$job"}` and `{job=~"$job", node=~"$node"}`
    (dashboards._matchers); per-process panels keep the node (one instance on two nodes)."""
    consumers = nodes[:-1] + f', role=~"{c.consumer_roles}"}}'
    producers = job[:-1] + f', role=~"{c.producer_roles}", op="put"}}'
    who = "{{job}} {{node}} {{role}} {{instance}}"
    return [
        timeseries_panel(
            "Outstanding rows", "Rows put and not yet cleared, all processes: rows waiting "
            "in the store (or read and not yet cleared).", "short",
            Query(f"sum by (job) ({n.OUTSTANDING_KEYS_SERIES}{job})", "{{job}}")),
        timeseries_panel(
            "Row age at read: p50, p99 and mean", "How long the rows read had sat in the "
            "store since their put (row age on: start(row_age=True) / DPOBS_ROW_AGE=1). "
            "Rising while consumers do not wait: consumer-bound. Across nodes as good as "
            "their clocks.", "s",
            Query(f"{n.JOB_OP_ROW_AGE_QUANTILE}{job}", "{{job}} {{op}} p{{quantile}}"),
            Query(f"{n.JOB_OP_ROW_AGE_MEAN}{job}", "{{job}} {{op}} mean"), log_scale=True),
        timeseries_panel(
            "Consumers: exposed, and waiting for rows",
            f"Per consumer ({c.consumer_roles}): exposed fraction of step, and the part of it "
            "with none of its reads in flight (exposed - busy): waiting for rows that are "
            f"not there. Above {c.queue_wait_frac:.0%} with young rows: producer-bound.",
            "percentunit",
            Query(f"{n.INSTANCE_EXPOSED_FRAC_OF_STEP}{consumers}", who + " exposed"),
            Query(f"{n.INSTANCE_EXPOSED_FRAC_OF_STEP}{consumers} - "
                  f"{n.INSTANCE_BUSY_FRAC_OF_STEP}{consumers}", who + " waiting for rows")),
        timeseries_panel(
            "Producers: puts per second", f"Put calls per second of the producers "
            f"({c.producer_roles}).", "reqps",
            Query(f"sum by (job, role) (rate({n.OP_DURATION_SERIES}_count{producers}{RI}))",
                  "{{job}} {{role}}")),
    ]
