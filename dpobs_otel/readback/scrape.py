"""Read dpobs processes' /metrics endpoints directly: no Prometheus needed.

    from dpobs_otel.readback import scrape
    targets = scrape.targets(sd_dir)                  # list[Target], from the file_sd files
    got = scrape.scrape_all(targets, timeout=1.0)     # {Target: ProcessTotals | Exception}

A `Target` is one listed endpoint: its address ("host:port", Prometheus's `instance`), its
file_sd labels (job, role, rank, and node when present), and what the file's name says about
its writer (see exporters/filesd.py): `incarnation` ("<boot id>.<start ticks>": a new value
for the same `process` key means the process restarted) and `alive` (False when nobody holds
the file's lock: its writer died without removing it, e.g. SIGKILL; None when that cannot be
told: another boot's file, a file without dpobs's name, or a filesystem without locks).

A `ProcessTotals` is one process's cumulative counters at one moment: per op (`OpTotals`) calls, seconds, errors, bytes read and
written, keys, missing rows and the latency histogram's cumulative buckets; steps, step
seconds, busy and exposed seconds (an absent counter reads 0); codec seconds per stage;
dpobs's own time and swallowed errors per component; outstanding bytes and keys (gauges); the
guard's counts in the shape stepmetrics.guard_flat gives (None when the process exports no
guard series: guard off, or on with nothing recorded yet); its weight syncs (readback/weights.py;
None when it exports no weight series); and the OpenTelemetry
`service.instance.id` from target_info (new on every start, so a restart shows even when the
counters have caught up).
`ProcessTotals.went_back(prev)` is the restart test on counters alone.

Differencing two snapshots is readback/cluster.py (`cluster.delta`).

`scrape` reads the text body (`parse`); protobody.read asks for the protobuf one and takes the
same samples from it, with the native histograms, in one request. Fetching runs in a thread pool, each request
with `timeout` seconds and the batch with a deadline of about the same; an endpoint that
refuses, times out, answers non-200 or sends something unparsable maps to its exception,
never raises. https with `ssl_context` (`tls_context`, for processes with DPOBS_TLS_*).
"""
from __future__ import annotations

import fcntl
import json
import os
import ssl
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from prometheus_client.parser import parse_labels, text_string_to_metric_families

from .. import names
from ..exporters.filesd import _OWNED, boot_id
from ..stepmetrics import guard_flat
from . import native
from .weights import SERIES as WEIGHT_SERIES
from .weights import UNUSED as WEIGHT_BUCKETS
from .weights import WeightTotals

PROCESS_LABELS = names.PROCESS_IDENTITY


@dataclass(frozen=True)
class Target:
    address: str
    labels: tuple[tuple[str, str], ...]  # sorted file_sd labels
    file: str | None = None
    incarnation: str | None = None
    alive: bool | None = None

    def label(self, name: str, default: str = "") -> str:
        return dict(self.labels).get(name, default)

    @property
    def process(self) -> tuple[str, ...]:
        """Who this is across restarts: (job, node, instance, role, rank); node is "" on a
        single machine. The same host:port on two nodes stays two processes."""
        d = dict(self.labels, instance=self.address)
        return tuple(d.get(k, "") for k in PROCESS_LABELS)


@dataclass
class OpTotals:
    calls: float = 0.0
    seconds: float = 0.0
    errors: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    keys: float = 0.0
    missing: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes


@dataclass
class ProcessTotals:
    ops: dict[str, OpTotals] = field(default_factory=dict)
    # Ray's ops (names.RAY_OPS): their own account; only their data time, by op, is
    # data-plane time (DESIGN.md "Moving data versus waiting (Ray)")
    ray_ops: dict[str, OpTotals] = field(default_factory=dict)
    ray_data: dict[str, float] = field(default_factory=dict)
    steps: float = 0.0
    step_seconds: float = 0.0
    busy_seconds: float = 0.0  # DESIGN.md "Time on the critical path"
    exposed_seconds: float = 0.0
    row_age_seconds: float = 0.0  # the row-age histogram's sum and count, over ops
    row_age_rows: float = 0.0
    codec_seconds: dict[str, float] = field(default_factory=dict)
    instrumentation_seconds: dict[str, float] = field(default_factory=dict)
    instrumentation_errors: dict[str, float] = field(default_factory=dict)
    outstanding_bytes: float = 0.0
    outstanding_keys: float = 0.0
    guard: dict[str, float] | None = None
    weights: WeightTotals | None = None  # None: the process never synced weights
    instance_id: str | None = None
    timestamp: float = 0.0  # when scraped (file_sd) or sampled (Prometheus), Unix seconds

    def went_back(self, prev: "ProcessTotals") -> bool:
        """True when this cannot follow `prev` from the same process: another instance id,
        a counter below its earlier value, or a series that was there and is gone."""
        if self.instance_id and prev.instance_id and self.instance_id != prev.instance_id:
            return True
        if not set(prev.ops) <= set(self.ops) or not set(prev.codec_seconds) <= set(
                self.codec_seconds):
            return True
        if any(getattr(self, k) < getattr(prev, k) for k in _STEP.values()):
            return True
        for op, p in prev.ops.items():
            n = self.ops[op]
            if (n.calls < p.calls or n.seconds < p.seconds or n.errors < p.errors
                    or n.bytes < p.bytes or n.keys < p.keys):
                return True
        if prev.guard and self.guard is None:
            return True
        if prev.weights is not None and (self.weights is None
                                         or self.weights.went_back(prev.weights)):
            return True
        return any(self.guard.get(k, 0) < v for k, v in (prev.guard or {}).items())


# -- discovery -------------------------------------------------------------------------

def targets(sd_dir: str, job: str | None = None, stores: bool = False) -> list[Target]:
    """Every dpobs process listed by the file_sd JSON files in sd_dir (one target per listed
    address), of job `job` if given, and with `stores` the stores' own exporters there too
    (names.STORE_ROLES). Unreadable or malformed files are skipped; no directory, no targets."""
    out = []
    try:
        entries = sorted(e for e in os.listdir(sd_dir) if e.endswith(".json"))
    except OSError:
        return []
    me = boot_id()
    for entry in entries:
        path = os.path.join(sd_dir, entry)
        try:
            with open(path) as f:
                doc = json.load(f)
            groups = [(list(g["targets"]), dict(g.get("labels", {}))) for g in doc]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        inc, alive = _writer(path, entry, me)
        for addrs, labels in groups:
            if job is not None and labels.get("job") != job:
                continue
            if not stores and labels.get("role") in names.STORE_ROLES:
                continue
            lab = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
            out += [Target(str(a), lab, path, inc, alive) for a in addrs]
    return out


def _writer(path: str, entry: str, me: str | None):
    """(incarnation, alive) from a dpobs file's name and lock."""
    m = _OWNED.search(entry)
    if m is None:
        return None, None
    inc = f"{m['boot']}.{m['start']}"
    if m["boot"] != me:
        return inc, None  # another kernel's file: its lock means nothing here
    return inc, _locked(path)


def _locked(path: str) -> bool | None:
    """Whether the file's writer still holds its lock (filesd.py's liveness test). Taking
    the lock for an instant on a dead writer's file is harmless: a sweeper that meets it
    locked judges it again next time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None  # a filesystem without locks: nobody can tell
    finally:
        os.close(fd)


# -- parsing ---------------------------------------------------------------------------

OP = names.OP_DURATION_SERIES
_OP_COUNTERS = {names.OP_ERRORS_SERIES: "errors", names.KEYS_SERIES: "keys",
                names.ROWS_MISSING_SERIES: "missing"}
_STEP = {names.STEP_DURATION_SERIES + "_count": "steps",  # series -> ProcessTotals field
         names.STEP_DURATION_SERIES + "_sum": "step_seconds",
         names.STEP_BUSY_SERIES: "busy_seconds", names.STEP_EXPOSED_SERIES: "exposed_seconds",
         names.ROW_AGE_SERIES + "_sum": "row_age_seconds",
         names.ROW_AGE_SERIES + "_count": "row_age_rows"}
_GUARD_KINDS = {names.GUARD_RECORDED_SERIES: "recorded", names.GUARD_CHECKED_SERIES: "checked",
                names.GUARD_MISMATCHED_SERIES: "mismatched",
                names.GUARD_UNVERIFIED_SERIES: "unverified"}


def totals_from_samples(samples, timestamp: float = 0.0) -> ProcessTotals:
    """One process's ProcessTotals from its samples: (name, labels, value) triples as the
    exposition or a Prometheus query gives them (extra target labels are ignored)."""
    t = ProcessTotals(timestamp=timestamp)
    guard: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        if name.startswith(OP):
            _op_sample(_op(t, labels), name[len(OP):], labels, value)
        elif name in _OP_COUNTERS:
            o = _op(t, labels)
            setattr(o, _OP_COUNTERS[name], getattr(o, _OP_COUNTERS[name]) + value)
        elif name == names.TRANSFERRED_SERIES:
            o = _op(t, labels)
            if labels.get("direction") == "read":
                o.read_bytes += value
            else:
                o.write_bytes += value
        elif name in _STEP:
            setattr(t, _STEP[name], getattr(t, _STEP[name]) + value)
        elif name == names.RAY_DATA_SERIES:
            _add(t.ray_data, labels.get("op", ""), value)
        elif name == names.CODEC_DURATION_SERIES + "_sum":
            _add(t.codec_seconds, labels.get("stage", ""), value)
        elif name == names.INSTR_TIME_SERIES:
            _add(t.instrumentation_seconds, labels.get("component", ""), value)
        elif name == names.INSTR_ERRORS_SERIES:
            _add(t.instrumentation_errors, labels.get("component", ""), value)
        elif name == names.OUTSTANDING_SIZE_SERIES:
            t.outstanding_bytes += value
        elif name == names.OUTSTANDING_KEYS_SERIES:
            t.outstanding_keys += value
        elif name.startswith("dpobs_guard_"):
            _guard_sample(guard, name, labels, value)
        elif name in WEIGHT_SERIES:
            if t.weights is None:
                t.weights = WeightTotals()
            t.weights.add(name, labels, value)
        elif name == "target_info":
            t.instance_id = labels.get("service_instance_id") or t.instance_id
    if guard:
        t.guard = dict(guard_flat(guard))
    return t


def _op(t: ProcessTotals, labels: dict) -> OpTotals:
    """The totals a sample of op `labels["op"]` adds to (Ray's ops apart, methods summed)."""
    op = labels.get("op", "")
    return (t.ray_ops if op in names.RAY_OPS else t.ops).setdefault(op, OpTotals())


def _add(d: dict, key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def _op_sample(o: OpTotals, suffix: str, labels: dict, value: float) -> None:
    if suffix == "_count":
        o.calls += value
    elif suffix == "_sum":
        o.seconds += value
    elif suffix == "_bucket":
        _add(o.buckets, float(labels["le"]), value)


def _guard_sample(guard: dict, name: str, labels: dict, value: float) -> None:
    if name in _GUARD_KINDS:
        _add(guard.setdefault(_GUARD_KINDS[name], {}), labels.get("field", ""), value)
    elif name == names.GUARD_SKIPPED_SERIES:
        _add(guard.setdefault("skipped", {}), labels.get("reason", ""), value)
    elif name == names.GUARD_FAILURES_SERIES:
        _add(guard.setdefault("failures", {}), labels.get("error_type", ""), value)


def parse(text: str, timestamp: float = 0.0) -> ProcessTotals:
    """ProcessTotals from a /metrics body (Prometheus text format).

    Label sets are parsed by prometheus_client's parser and memoised: they are bounded by
    design and repeat across scrapes and processes, and label parsing is nearly all of the
    parser's time (docs/development/performance.md has both costs). A line this reading does not
    understand falls back to the full parser for the whole body."""
    try:
        return totals_from_samples(_samples(text), timestamp)
    except ValueError:
        return totals_from_samples(_full_samples(text), timestamp)


_LABELS: dict[str, dict[str, str]] = {}
# Buckets nothing here reads (a third of a typical body): skipped before any parsing.
_UNUSED = (names.STEP_DURATION_SERIES + "_bucket", names.CODEC_DURATION_SERIES + "_bucket",
           WEIGHT_BUCKETS)
_LABELS_MAX = 50_000


def _samples(text: str):
    """(name, labels, value) of the dpobs_* and target_info lines. A sample line is
    `name{labels} value [timestamp]`; names hold no '{' and values or timestamps no '}',
    so the first '{' and the last '}' delimit the labels."""
    for line in text.split("\n"):
        if not line.startswith(("dpobs_", "target_info")) or line.startswith(_UNUSED):
            continue
        brace = line.find("{")
        if brace < 0:
            name, _, rest = line.partition(" ")
            labels = {}
        else:
            end = line.rindex("}")
            name, key, rest = line[:brace], line[brace + 1:end], line[end + 1:]
            labels = _LABELS.get(key)
            if labels is None:
                if len(_LABELS) >= _LABELS_MAX:
                    _LABELS.clear()
                labels = _LABELS[key] = parse_labels(key, False)
        yield name, labels, float(rest.split()[0])


def _full_samples(text: str):
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


# -- fetching --------------------------------------------------------------------------

def tls_context(cafile: str | None = None, certfile: str | None = None,
                keyfile: str | None = None) -> ssl.SSLContext:
    """A client context for endpoints served over TLS: verifies them against `cafile`
    (default: the system's CAs) and presents certfile/keyfile when they ask (mutual TLS)."""
    ctx = ssl.create_default_context(cafile=cafile)
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


ScrapeError = native.HTTPStatusError  # an answer other than 200


def fetch(target: Target, timeout: float = 1.0,
          ssl_context: ssl.SSLContext | None = None) -> str:
    """The text /metrics body of one target (https when ssl_context is given); raises
    OSError (ScrapeError for a non-200 answer) on failure."""
    return native.get(target.address, "text/plain", timeout, ssl_context)[1].decode()


def scrape(target: Target, timeout: float = 1.0,
           ssl_context: ssl.SSLContext | None = None) -> ProcessTotals:
    """One target's ProcessTotals from its text body, timestamped when its answer arrived;
    raises on failure."""
    return parse(fetch(target, timeout, ssl_context), time.time())


def scrape_all(targets: list[Target], timeout: float = 1.0,
               ssl_context: ssl.SSLContext | None = None, max_workers: int = 32,
               pool: ThreadPoolExecutor | None = None, how=scrape) -> dict:
    """Every target scraped in parallel: {target: what `how` returns (ProcessTotals;
    protobody.read's pair with the native histograms), or the exception that stopped it}.
    Returns within about timeout (+ parsing) however many hang; a target still unanswered at
    the deadline maps to TimeoutError. `pool`: a caller's executor, reused across calls
    (else one of up to max_workers threads lives for this call). Never raises."""
    out: dict = {}
    if not targets:
        return out
    own = pool is None
    if own:
        pool = ThreadPoolExecutor(min(max_workers, len(targets)),
                                  thread_name_prefix="dpobs-scrape")
    try:
        futures = {pool.submit(how, t, timeout, ssl_context): t for t in targets}
        done, _ = wait(futures, timeout=timeout + 1.0)
        for fut, t in futures.items():
            if fut not in done:
                fut.cancel()
                out[t] = TimeoutError(f"{t.address}: no answer within {timeout} s")
            elif fut.exception() is not None:
                out[t] = fut.exception()
            else:
                out[t] = fut.result()
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)
    return out

