"""`dpobs doctor [--sd-dir DIR] [--prometheus URL] [--alertmanager URL] [--job NAME]`: one line
per check (checks.py), what to do beside each that fails; exit 0 when every check its
arguments allow holds, 1 otherwise. Never a traceback: a bad URL, nothing listening, a missing
directory are each a failed check's line; a link that is broken skips those behind it."""
from __future__ import annotations

import argparse
import os
import sys

from ..readback.prometheus import PrometheusError
from . import checks
from .checks import Check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sd-dir", metavar="DIR", help="the file_sd directory the job's processes "
                   "register in (default: $DPOBS_SD_DIR)")
    p.add_argument("--prometheus", metavar="URL", help="the Prometheus that scrapes them (or "
                   "that their agents remote-write to) and loads dpobs's rules")
    p.add_argument("--alertmanager", metavar="URL", help="the Alertmanager that should get "
                   "the alerts (default: those Prometheus sends to)")
    p.add_argument("--job", metavar="NAME", help="only this job's processes (default: all)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="per request (default %(default)s)")


def _safe(name: str, fn, *args) -> Check:
    """The check, or its failure as a line: whatever a server answers, no traceback."""
    try:
        return fn(*args)
    except PrometheusError as e:
        return Check(name, False, str(e), "see the Prometheus check above")
    except Exception as e:  # noqa: BLE001 - doctor reports, it never crashes
        return Check(name, False, f"{type(e).__name__}: {e}", "")


def _url(flag: str, url: str | None) -> Check | None:
    if url and not url.startswith(("http://", "https://")):
        return Check(flag.removeprefix("--"), False, f"{flag} {url}: not an http:// or "
                     "https:// URL", f"e.g. {flag} http://HOST:PORT")
    return None


def diagnose(sd_dir: str | None, prometheus: str | None, alertmanager: str | None,
             job: str | None, timeout: float = 5.0) -> list[Check]:
    """Every check its arguments allow, in the order data flows."""
    out: list[Check] = []
    reading = None
    if sd_dir:
        found = _safe("registered", lambda: checks.registered(sd_dir, job, timeout))
        first, reading = found if isinstance(found, tuple) else (found, None)
        out.append(first)
        if reading is not None and reading.processes:
            out.append(_safe("answering /metrics", checks.answering, reading))
    else:
        out.append(Check("registered", None, "needs --sd-dir DIR (or DPOBS_SD_DIR)"))
    bad = [c for c in (_url("--prometheus", prometheus), _url("--alertmanager", alertmanager))
           if c is not None]
    if bad:
        return out + bad
    prom = None
    if prometheus:
        first, prom = checks.reachable(prometheus, timeout)
        out.append(first)
        if prom is None:  # what hangs on it is not run; the Alertmanager given still is
            return out + ([_safe("alertmanager", checks.alertmanager, None, alertmanager,
                                 timeout)] if alertmanager else [])
    else:
        out.append(Check("prometheus", None, "needs --prometheus URL: scraping, rules, "
                         "alerts and native histograms unchecked"))
    if prom is not None:
        out.append(_safe("scraped and up", checks.scraped, prom, job, reading))
        groups = _safe("rules", prom.rules)
        if isinstance(groups, Check):
            return out + [groups]
        out += [_safe("recording rules loaded", checks.rules_loaded, groups),
                _safe("rules evaluating", checks.evaluating, groups),
                _safe("alert rules loaded", checks.alerts_loaded, groups)]
    if prom is not None or alertmanager:
        out.append(_safe("alertmanager", checks.alertmanager, prom, alertmanager, timeout))
    if prom is not None:
        out.append(_safe("native histograms", checks.native, prom, job, reading))
    out.append(_safe("label budget", checks.label_budget, prom, job, reading))
    return out


def run(args: argparse.Namespace) -> int:
    sd_dir = args.sd_dir or os.environ.get("DPOBS_SD_DIR")
    if not (sd_dir or args.prometheus or args.alertmanager):
        raise SystemExit("dpobs doctor: give --sd-dir DIR and/or --prometheus URL "
                         "(and --alertmanager URL): nothing to check")
    found = diagnose(sd_dir, args.prometheus, args.alertmanager, args.job, args.timeout)
    for c in found:
        print(c.line())
    broken = sum(c.ok is False for c in found)
    held = sum(c.ok is True for c in found)
    print(f"{held} checks hold, {broken} fail" + (f", {len(found) - held - broken} not run"
                                                   if len(found) > held + broken else ""))
    sys.stdout.flush()
    return 1 if broken else 0
