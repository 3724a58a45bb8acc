"""The overview's row *The store's own account* (DESIGN.md "Recording rules": the
job_op:dpobs_store_* records; docs/guides/transferqueue.md "The store's own account"): where an op's
time goes, client or server, and whether every process that touches the store is measured.
Empty for a job whose store has no exporter scraped (no `tq-controller` target): every query
here reads the store's records or its own series. DpobsUnmeasuredClients's runbook section
names the row and its coverage panels."""
from __future__ import annotations

from .. import names as n
from ..adapters.transferqueue import exporter as tq
from .config import Config
from .panels import Query, timeseries_panel


def _split_queries(c: Config, job: str) -> tuple[Query, ...]:
    """Each op's share of data-plane time split by its server share: the store's part, the
    client's remainder, and ops the store bills nothing for (in jobs it serves). Clamped, so
    an op's two parts never leave its band, even where the server share passes 1."""
    share, server = f"{n.JOB_OP_SHARE}{job}", f"{n.JOB_OP_STORE_SERVER_SHARE}{job}"
    weighted = f"\n  * {c.on('job', 'op')} {share}"
    return (
        Query(f"clamp_max({server}, 1){weighted}", "{{job}} {{op}} server"),
        Query(f"clamp_min(1 - {server}, 0){weighted}", "{{job}} {{op}} client side"),
        Query(f"{share}\n  unless {c.on('job', 'op')} {server}\n"
              f"  and {c.on('job')} {n.JOB_OP_STORE_SERVED}{job}",
              "{{job}} {{op}} no server account"))


def store_panels(c: Config, job: str) -> list:
    """job: the dashboard's matcher, `{job=~"$job"}` (dashboards._matchers)."""
    alert = (f"{n.ALERT_UNMEASURED_CLIENTS} fires below {c.unmeasured_coverage:.0%} for "
             f"{c.unmeasured_for}.")
    return [
        timeseries_panel(
            "Client versus server time per op",
            "Each op's band is its share of data-plane time (as in Share of data-plane time "
            "by op), split by the store's account: server, the store's seconds for the "
            "requests the op made (the controller's metadata work and the storage units' "
            "reads and writes); client side, the rest (serialization, the wire, queueing in "
            "the client). A server share above 100% (storage units serving one call in "
            "parallel) fills its op's band: read it unclamped on the right. No server "
            "account: an op the store bills no request for.", "percentunit",
            *_split_queries(c, job), stacked=True, max_value=1, repeat="job"),
        timeseries_panel(
            "Server share per op",
            "The store's seconds for an op's requests / the clients' seconds in that op, over "
            "5m. Near 100%: the store's own work is the op's time; low: the client side is. "
            "Above 100% where storage units serve one call in parallel (seconds of work, not "
            "of waiting).", "percentunit",
            Query(f"{n.JOB_OP_STORE_SERVER_SHARE}{job}", "{{job}} {{op}}")),
        timeseries_panel(
            "Coverage per op",
            "Calls the measured clients made / calls the store served, per op (each counted "
            "by a request only that op makes: docs/guides/transferqueue.md, Coverage), and for the "
            "job. 100%: every process that touches the store is measured; below it, "
            "something moves data without dpobs; 0: no measured process makes that op. "
            + alert, "percentunit",
            Query(f"{n.JOB_OP_STORE_COVERAGE}{job}", "{{job}} {{op}}"),
            Query(f"{n.JOB_STORE_COVERAGE}{job}", "{{job}} all ops"), width=8),
        timeseries_panel(
            "Calls made and served per op",
            "Per second over 5m: calls the measured clients made, and the calls the store "
            "served, per op (reads pool get and get_data as get). Served minus made is the "
            "unmeasured rate.", "reqps",
            Query(f"{n.JOB_OP_STORE_MADE}{job}", "{{job}} {{op}} made (measured)"),
            Query(f"{n.JOB_OP_STORE_SERVED}{job}", "{{job}} {{op}} served (store)"), width=8),
        timeseries_panel(
            "Keys: the store's active beside dpobs's outstanding",
            "Rows the store's units hold (TransferQueue gathers them every "
            f"{tq.COLLECT_INTERVAL_ENV}, 10 s by default) beside the rows the measured "
            "clients put and have not cleared. The store above dpobs: rows put by clients dpobs "
            "does not measure; dpobs above the store: rows cleared by such clients (the "
            "store's figure lags by up to one collection).", "short",
            *_keys_queries(c, job), width=8),
    ]


def _keys_queries(c: Config, job: str) -> tuple[Query, Query]:
    """The store's keys, and dpobs's only for the jobs whose store is scraped (alone, they
    are the queue row's Outstanding rows)."""
    store = f"sum {c.by('job')} ({tq.STORAGE_ACTIVE_KEYS}{job})"
    return (Query(store, "{{job}} store: active keys"),
            Query(f"sum {c.by('job')} ({n.OUTSTANDING_KEYS_SERIES}{job})\n"
                  f"  and {c.on('job')} {store}", "{{job}} dpobs: outstanding keys"))
