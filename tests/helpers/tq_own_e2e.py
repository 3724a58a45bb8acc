"""A pytest plugin for TransferQueue's own end-to-end tests (tests/e2e/ in its wheel), run
with TransferQueueInstrumentor on: every kv_* call the tests make is counted here, above the
instrumentor, beside what dpobs served on /metrics for it. Loaded with `-p helpers.tq_own_e2e`
by tests/adapters/transferqueue/test_tq_own_e2e.py, which compares the two; the session's
result goes to the JSON file named by $DPOBS_TQ_E2E_OUT.

Ray stays on loopback: the tests' own bare `ray.init(namespace=...)` gets the address,
dashboard and CPU settings of dpobs_otel.testing.transferqueue (their SimpleStorage config
is a controller and two storage units, one logical CPU each, on a 2-core box)."""
from __future__ import annotations

import os

from dpobs_otel.testing.transferqueue import LOOPBACK_ENV, LOOPBACK_IP

os.environ.update(LOOPBACK_ENV)  # before ray is imported, by the tests or below

import collections  # noqa: E402
import functools  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402

OP = {"kv_put": "put", "kv_batch_put": "put", "kv_batch_get": "get",
      "kv_batch_get_by_meta": "get", "kv_list": "list", "kv_clear": "clear"}
OPS = "dpobs_client_operation_duration_seconds_count"
ERRORS = "dpobs_client_operation_errors_total"


class _Calls:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = collections.Counter()
        self.errors = collections.Counter()

    def add(self, op, error=None):
        with self.lock:
            self.ops[op] += 1
            if error is not None:
                self.errors[f"{op}/{type(error).__name__}"] += 1


def _counted(name, fn, calls):
    op = OP[name.removeprefix("async_")]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def counted(*args, **kwargs):
            try:
                out = await fn(*args, **kwargs)
            except Exception as exc:
                calls.add(op, exc)
                raise
            calls.add(op)
            return out
    else:
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:
                calls.add(op, exc)
                raise
            calls.add(op)
            return out
    return counted


def _ray_on_loopback():
    import ray

    init = ray.init

    @functools.wraps(init)
    def loopback_init(*args, **kwargs):
        if not args and kwargs.get("address") in (None, "local"):
            kwargs.update(address="local", _node_ip_address=LOOPBACK_IP,
                          include_dashboard=False, log_to_driver=False)
            kwargs.setdefault("num_cpus", 4)
            kwargs.setdefault("object_store_memory", 200 * 1024**2)
        return init(*args, **kwargs)

    ray.init = loopback_init


class _Session:
    def __init__(self):
        import transfer_queue

        import dpobs_otel as dpobs
        from dpobs_otel.adapters.transferqueue import KV_FUNCTIONS, TransferQueueInstrumentor

        _ray_on_loopback()
        self.calls = _Calls()
        self.outcomes = collections.Counter()
        self.collected = 0
        guard = os.environ.get("DPOBS_TQ_E2E_GUARD") == "1"
        self.tel = dpobs.start(role="tq-e2e", rank=0, port=0, verify_tensor_hash=guard)
        self.instrumentor = TransferQueueInstrumentor()
        self.instrumentor.instrument(telemetry=self.tel)
        for name in KV_FUNCTIONS:  # counted above the measured functions: the tests' calls
            setattr(transfer_queue, name, _counted(name, getattr(transfer_queue, name),
                                                   self.calls))

    def pytest_collection_modifyitems(self, items):
        self.collected = len(items)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[f"{report.when}:{report.outcome}"] += 1

    def pytest_sessionfinish(self, session, exitstatus):
        from helpers import scrape

        samples = scrape(self.tel)
        served, errors = collections.Counter(), collections.Counter()
        for (name, labels), v in samples.items():
            labels = dict(labels)
            if name == OPS and labels.get("op") in OP.values():
                served[labels["op"]] += int(v)
            elif name == ERRORS and v:
                errors[f"{labels['op']}/{labels.get('error_type')}"] += int(v)
        out = {"collected": self.collected, "outcomes": dict(self.outcomes),
               "exitstatus": int(exitstatus), "calls": dict(self.calls.ops),
               "call_errors": dict(self.calls.errors), "served": dict(served),
               "served_errors": dict(errors)}
        with open(os.environ["DPOBS_TQ_E2E_OUT"], "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        self.tel.shutdown()


def pytest_configure(config):
    config.pluginmanager.register(_Session(), "dpobs-tq-own-e2e")
