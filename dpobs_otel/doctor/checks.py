"""The links `dpobs doctor` checks, in the order data flows: processes registered in the file_sd
directory and answering /metrics; Prometheus answering; each process a series `up` there (a
target it scrapes, or one an agent remote-writes) and up; dpobs's recording rules loaded and
evaluating within their interval; its alert rules loaded and an Alertmanager that answers;
native histograms ingested where a process serves them; no process over a label budget.

Each check is a Check: held (True), broken (False: what was found and the fix), or not run
(None: its arguments do not allow it, or a link before it is broken, said why). The names of
dpobs's rules and alerts come from the mixin's generators, so a check never retypes one.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .. import names
from ..readback.prometheus import Prometheus, PrometheusError, timestamp
from ..readback.sources import FileSDSource, Reading

# The component that counts label values folded past a process's label budget (the scale
# issue's counter; the series is absent where no process ever overflowed).
OVERFLOW = "overflow"
SHOWN = 3  # processes named in one line; the rest counted
STORES = "|".join(sorted(names.STORE_ROLES))  # the stores' own exporters: not job processes


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not run
    said: str
    fix: str = ""

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[self.ok]
        fix = f" -> fix: {self.fix}" if self.ok is False and self.fix else ""
        return f"{mark}  {self.name}: {self.said}{fix}"


def who(labels: dict) -> str:
    role = " ".join(filter(None, (labels.get("role"), labels.get("rank"))))
    return f"{role or 'a process'} at {labels.get('instance', '?')}"


def listing(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _of(job: str | None) -> str:
    return f" of job {job}" if job else ""


# -- the file_sd directory ---------------------------------------------------------------

def registered(sd_dir: str, job: str | None, timeout: float) -> tuple[Check, Reading | None]:
    """The processes listed in sd_dir, each scraped once (the reading the later checks use)."""
    name = "registered"
    if not os.path.isdir(sd_dir):
        return Check(name, False, f"no directory {sd_dir}",
                     "give the directory the job's processes register in (their "
                     "DPOBS_SD_DIR)"), None
    reading = FileSDSource(sd_dir, job, timeout).read()
    n, ended = len(reading.processes), len(reading.lost)
    gone = f" ({ended} files of processes that have ended)" if ended else ""
    if not n:
        env = f"DPOBS_SD_DIR={sd_dir}" + (f" and DPOBS_JOB={job}" if job else "")
        return Check(name, False, f"no process{_of(job)} registered in {sd_dir}{gone}",
                     f"start the job's processes with {env}"), reading
    return Check(name, True, f"{processes(n)}{_of(job)} in {sd_dir}{gone}"), reading


def answering(reading: Reading) -> Check:
    seen = list(reading.processes.values())
    down = [f"{who(s.labels)} ({type(s.error).__name__}: {s.error})" for s in seen
            if s.totals is None]
    if down:
        return Check("answering /metrics", False,
                     f"{len(down)} of {len(seen)} do not answer: {listing(down)}",
                     "a process that hangs or has ended without removing its file (the next "
                     "start on its node sweeps it), or a port this machine cannot reach")
    return Check("answering /metrics", True, f"all {len(seen)} answer")


# -- Prometheus ---------------------------------------------------------------------------

def reachable(url: str, timeout: float) -> tuple[Check, Prometheus | None]:
    prom = Prometheus(url, timeout)
    try:
        version = prom.api("status/buildinfo").get("version", "?")
    except PrometheusError as e:
        return Check("prometheus", False, str(e), "the URL of a running Prometheus (its web "
                     "UI's, e.g. http://HOST:9090)"), None
    return Check("prometheus", True, f"{prom.url} answers (Prometheus {version})"), prom


def selector(job: str | None) -> str:
    """The job's processes in Prometheus: its targets that carry a role, not a store's."""
    return (f'job="{job}", ' if job else "") + f'role!="", role!~"{STORES}"'


def up(prom: Prometheus, job: str | None) -> dict[tuple[str, str], tuple[dict, float]]:
    """(job, instance) -> (labels, value of `up`)."""
    return {(r["metric"].get("job", ""), r["metric"].get("instance", "")): (r["metric"], r["value"])
            for r in prom.query(f"up{{{selector(job)}}}")}


SCRAPE_FIX = ("have Prometheus scrape the directory's *.json (a file_sd_configs entry; `dpobs "
              "mixin` writes a prometheus.yml with one), or run `dpobs agent --sd-dir DIR "
              "--remote-write URL` on their node with a receiver that accepts it (Prometheus: "
              "--web.enable-remote-write-receiver; the agent's log says why a write failed)")


def scraped(prom: Prometheus, job: str | None, reading: Reading | None) -> Check:
    name = "scraped and up"
    series = up(prom, job)
    if reading is not None:
        listed = {(s.labels["job"], s.labels["instance"]): s.labels
                  for s in reading.processes.values()}
        missing = [who(lab) for key, lab in listed.items() if key not in series]
        if missing:
            return Check(name, False, f"{len(missing)} of {len(listed)} processes not in "
                         f"Prometheus: {listing(missing)}", SCRAPE_FIX)
        series = {k: v for k, v in series.items() if k in listed}
    elif not series:
        return Check(name, False, f"no dpobs process{_of(job)} in Prometheus", SCRAPE_FIX)
    down = [m for m, v in series.values() if v != 1]
    if down:  # a target Prometheus scrapes itself says why (an agent's do not reach here)
        errors = {t["labels"].get("instance"): t.get("lastError", "") for t in prom.targets()}
        said = [who(m) + (f" ({errors[m.get('instance')]})" if errors.get(m.get("instance"))
                          else "") for m in down]
        return Check(name, False, f"Prometheus finds {len(down)} of {len(series)} down: "
                     f"{listing(said)}", "the port refuses Prometheus's host (its bind "
                     "address, a firewall, TLS), or the process hangs")
    return Check(name, True, f"{processes(len(series))}{_of(job)}, all up in Prometheus")


def _mixin_rules(kind: str) -> set[str]:
    """The names of dpobs's recording rules ("record") or alerts ("alert")."""
    from ..mixin.alerts import alert_groups
    from ..mixin.config import DEFAULT
    from ..mixin.rules import recording_groups
    groups = recording_groups(DEFAULT) if kind == "record" else alert_groups(DEFAULT)
    return {r.body[kind] for g in groups for r in g.rules}


RULES_FIX = ("add {file} to rule_files in prometheus.yml (`dpobs mixin --out DIR` writes it "
             "under DIR/prometheus/rules/) and reload Prometheus (SIGHUP or POST /-/reload)")


def _loaded(groups: list[dict], kind: str) -> Check:
    want = _mixin_rules(kind)
    rtype, what, file = (("recording", "recording rules", "dpobs-recording.rules.yml")
                         if kind == "record" else
                         ("alerting", "alert rules", "dpobs-alerts.rules.yml"))
    have = {r["name"] for g in groups for r in g.get("rules", []) if r.get("type") == rtype}
    missing = sorted(want - have)
    name = f"{what} loaded"
    if missing:
        return Check(name, False, f"{len(missing)} of {len(want)} dpobs {what} not loaded "
                     f"(e.g. {listing(missing)})", RULES_FIX.format(file=file))
    return Check(name, True, f"all {len(want)} dpobs {what}")


def rules_loaded(groups: list[dict]) -> Check:
    return _loaded(groups, "record")


def alerts_loaded(groups: list[dict]) -> Check:
    return _loaded(groups, "alert")


def evaluating(groups: list[dict], now: float | None = None) -> Check:
    """Every group holding a dpobs rule evaluated within its interval (twice it, and at
    least 5 s more: one evaluation may be under way on a busy server), none of its rules
    failing."""
    name = "rules evaluating"
    ours = _mixin_rules("record") | _mixin_rules("alert")
    mine = [g for g in groups if any(r.get("name") in ours for r in g.get("rules", []))]
    if not mine:
        return Check(name, None, "no dpobs rule loaded to evaluate")
    now = time.time() if now is None else now
    late, failing = [], []
    for g in mine:
        last, every = timestamp(g.get("lastEvaluation", "")), float(g.get("interval", 0))
        if last is None or now - last > max(2 * every, every + 5):
            ago = "never" if last is None else f"{now - last:.0f}s ago"
            late.append(f"{g['name']} (every {every:g}s, last {ago})")
        failing += [f"{r['name']}: {r.get('lastError', '')}" for r in g.get("rules", [])
                    if r.get("health") == "err"]
    if late:
        return Check(name, False, f"late: {listing(late)}", "Prometheus is overloaded or its "
                     "rule manager stalled: see its log and "
                     "prometheus_rule_group_iterations_missed_total")
    if failing:
        return Check(name, False, f"failing: {listing(failing)}", "a rule file from another "
                     "dpobs version: regenerate it with this one's `dpobs mixin`")
    return Check(name, True, f"{len(mine)} groups, each within its interval")


def alertmanager(prom: Prometheus | None, url: str | None, timeout: float) -> Check:
    """The Alertmanagers Prometheus sends to (and `url`, which must be one of them) answer."""
    name = "alertmanager"
    sent_to = prom.alertmanagers() if prom is not None else []
    if prom is not None and not sent_to:
        return Check(name, False, "Prometheus sends its alerts to no Alertmanager",
                     "add alerting.alertmanagers to prometheus.yml (`dpobs mixin` writes one)")
    if url and prom is not None and url.rstrip("/") not in sent_to:
        return Check(name, False, f"Prometheus sends its alerts to {listing(sent_to)}, not "
                     f"{url}", "point alerting.alertmanagers of prometheus.yml at it")
    urls = [url] if url else sent_to
    dead = [u for u in urls if not Prometheus(u, timeout).ready()]
    if dead:
        return Check(name, False, f"{listing(dead)} does not answer", "start it, or fix its "
                     "address: alerts fire in Prometheus and reach no one")
    return Check(name, True, f"{listing(urls)} answers" +
                 ("; Prometheus sends its alerts there" if prom is not None else ""))


def native(prom: Prometheus, job: str | None, reading: Reading | None) -> Check:
    """Every process that serves native histograms and is up in Prometheus has them there."""
    name = "native histograms"
    if reading is None:
        return Check(name, None, "needs --sd-dir DIR to know which processes serve them")
    serving = {(s.labels["job"], s.labels["instance"]): s.labels
               for s in reading.processes.values() if s.native}
    if not serving:
        return Check(name, True, "no process serves them (nothing to ingest)")
    scraped_up = {k for k, (_, v) in up(prom, job).items() if v == 1}
    have = {(r["metric"].get("job", ""), r["metric"].get("instance", "")) for r in prom.query(
        f"count by (job, instance) ({names.OP_DURATION_NATIVE_SERIES}{{{selector(job)}}})")}
    checked = [k for k in serving if k in scraped_up]
    if not checked:
        return Check(name, None, "no process that serves them is up in Prometheus (see "
                     "scraped and up)")
    missing = [who(serving[k]) for k in checked if k not in have]
    if missing:
        return Check(name, False, f"served but not in Prometheus: {listing(missing)}",
                     "Prometheus 2.x ingests them only with --enable-feature=native-histograms "
                     "(3.x: scrape_native_histograms: true); through an agent, its receiver "
                     "must take them too")
    return Check(name, True, f"ingested from all that serve them ({processes(len(checked))})")


def label_budget(prom: Prometheus | None, job: str | None, reading: Reading | None) -> Check:
    """No process has folded label values past its budget (the overflow counter; absent
    where none ever did). From Prometheus where given, else from the directory's scrape."""
    name = "label budget"
    if prom is not None:
        over = [f"{who(r['metric'])} ({r['value']:.0f} folded)" for r in prom.query(
            f"sum by (job, instance, role, rank) ({names.INSTR_ERRORS_SERIES}"
            f'{{component="{OVERFLOW}", {selector(job)}}}) > 0')]
    elif reading is not None:
        over = [f"{who(s.labels)} ({s.totals.instrumentation_errors[OVERFLOW]:.0f} folded)"
                for s in reading.processes.values()
                if s.totals is not None and s.totals.instrumentation_errors.get(OVERFLOW)]
    else:
        return Check(name, None, "needs --prometheus URL or --sd-dir DIR")
    if over:
        return Check(name, False, f"{processes(len(over))} over a label budget: "
                     f"{listing(over)}", "a label takes more values than its budget and the "
                     "rest are counted together: bound its values (see the runbook's "
                     f"{names.ALERT_CARDINALITY_OVERFLOW})")
    return Check(name, True, "no process over its label budget")
