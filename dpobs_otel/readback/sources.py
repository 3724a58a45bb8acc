"""Where the cluster view (cluster.py) reads every process's cumulative counters from: a
file_sd directory (FileSDSource: each listed endpoint scraped at the call) or a Prometheus
(PrometheusSource: the latest raw samples of every process, from the Prometheus the agents
remote-write to, or the one that scrapes the processes). Each read is a `Reading`.

The Prometheus source makes three instant queries per read: every dpobs_* and target_info
series of the job, `up` (a process whose last scrape failed is unreachable) and
`timestamp(up)` (when each process was last scraped: staleness_s is the oldest of those,
against the call's wall clock). Samples lag the processes by up to one scrape interval plus
the remote-write delay, so a window there is a window of scrapes, not of the calls;
consecutive calls still tile time without gaps or overlap, since each difference starts
where the last one ended.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from ..names import OP_DURATION_NATIVE_SERIES
from . import native, scrape
from .native import NativeHistogram
from .prometheus import Prometheus, PrometheusError
from .scrape import PROCESS_LABELS, ProcessTotals, totals_from_samples


@dataclass
class Seen:
    """One process as one read found it: totals None when listed but unanswered."""
    labels: dict[str, str]  # job, node, instance, role, rank
    totals: ProcessTotals | None
    incarnation: str | None = None
    error: BaseException | None = None
    # op -> its cumulative native op-duration histogram; None when not read (a Prometheus
    # source, or the protobuf request failed), {} when the endpoint serves none
    native: dict[str, NativeHistogram] | None = None


@dataclass
class Reading:
    processes: dict[tuple, Seen]
    lost: set[tuple]  # listed, but certainly dead (a file_sd file nobody holds)
    staleness_s: float | None = None


class FileSDSource:
    """Reads by scraping every endpoint a file_sd directory lists, at the call: the text
    exposition (the counters), then, from the endpoints that answered it, the protobuf one
    (the native op-duration histograms, native.fetch): two requests per endpoint, both in
    the pool, the second batch after the first. The counters cannot be read from the
    protobuf body without a decoder for every metric type, and the native histograms are
    not in the text one; the two reads are a few milliseconds apart."""

    def __init__(self, sd_dir: str, job: str | None = None, timeout: float = 1.0,
                 ssl_context=None):
        self.sd_dir, self.job, self.timeout, self.ssl_context = sd_dir, job, timeout, ssl_context
        self._pool: ThreadPoolExecutor | None = None  # made at the first call, then kept

    def read(self) -> Reading:
        listed: dict[tuple, scrape.Target] = {}
        dead = set()
        for t in scrape.targets(self.sd_dir, self.job):
            if t.alive is False:
                dead.add(t.process)
            elif listed.get(t.process) is None or t.alive:  # a live file wins a dead one
                listed[t.process] = t
        if self._pool is None:
            self._pool = ThreadPoolExecutor(32, thread_name_prefix="dpobs-cluster")
        got = scrape.scrape_all(list(listed.values()), self.timeout, self.ssl_context,
                                pool=self._pool)
        hists = self._native([t for t in listed.values() if isinstance(got[t], ProcessTotals)])
        out = {}
        for key, t in listed.items():
            r = got[t]
            labels = dict(zip(PROCESS_LABELS, key))
            if isinstance(r, ProcessTotals):
                out[key] = Seen(labels, r, t.incarnation, native=hists.get(t))
            else:
                out[key] = Seen(labels, None, t.incarnation, r)
        return Reading(out, dead - set(out))

    def _native(self, targets: list) -> dict:
        """{target: op -> native histogram} of those whose protobuf answer came in time."""
        futures = {self._pool.submit(native.fetch, t.address, self.timeout, self.ssl_context): t
                   for t in targets}
        done, _ = wait(futures, timeout=self.timeout + 1.0)
        out = {}
        for fut, t in futures.items():
            if fut in done and fut.exception() is None:
                out[t] = native.by_label(fut.result(), OP_DURATION_NATIVE_SERIES, "op")
            else:
                fut.cancel()
        return out


class PrometheusSource:
    """Reads the latest raw samples of every process of `job` (None: every job)."""

    def __init__(self, url: str, job: str | None = None, timeout: float = 2.0,
                 ssl_context=None):
        self.prom = Prometheus(url, timeout, ssl_context)
        self.job = job

    def read(self) -> Reading:
        m = f'job="{self.job}"' if self.job is not None else 'job=~".+"'
        # float samples only: the native histogram (a Prometheus with native histograms on)
        # is not a ProcessTotals input
        series = self.prom.query(f'{{__name__=~"dpobs_.+|target_info", '
                                 f'__name__!="{OP_DURATION_NATIVE_SERIES}", {m}}}')
        up = {_key(r["metric"]): r["value"] for r in self.prom.query(f"up{{{m}}}")}
        seen_at = {_key(r["metric"]): r["value"]
                   for r in self.prom.query(f"timestamp(up{{{m}}})")}
        now = time.time()
        samples: dict[tuple, list] = {}
        for r in series:
            metric = r["metric"]
            samples.setdefault(_key(metric), []).append(
                (metric.get("__name__", ""), metric, r["value"]))
        out = {}
        for key in set(samples) | set(up):
            labels = dict(zip(PROCESS_LABELS, key))
            if up.get(key, 1.0) == 0.0 or key not in samples:
                out[key] = Seen(labels, None, error=PrometheusError("up == 0"))
                continue
            out[key] = Seen(labels, totals_from_samples(samples[key], seen_at.get(key, now)))
        fresh = [seen_at[k] for k in out if k in seen_at and out[k].totals is not None]
        return Reading(out, set(), max(now - t for t in fresh) if fresh else None)


def _key(metric: dict) -> tuple:
    return tuple(metric.get(k, "") for k in PROCESS_LABELS)


def source_for(source, job: str | None, timeout: float, ssl_context=None):
    """A Prometheus URL (http:// or https://; its certificate checked against the system's
    CAs) or a file_sd directory (its endpoints over https when ssl_context is given)."""
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return PrometheusSource(source, job, timeout)
    return FileSDSource(str(source), job, timeout, ssl_context)
