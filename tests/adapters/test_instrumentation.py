"""The instrumentors' shared base (adapters/instrumentation.py): the mark of dpobs's own calls
and where it reaches, each package's declared instrumented packages against its extra and
entry point, and dpobs starting on the first measured call in each process."""
from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import threading
import tomllib
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import scrape, value
from helpers.transferqueue import KEYS, OPS
from packaging.requirements import Requirement

from dpobs_otel import auto
from dpobs_otel.adapters.instrumentation import Instrumentor, OwnCalls, is_own_call, own, own_calls
from dpobs_otel.adapters.mooncake import MooncakeInstrumentor

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
PACKAGES = {"transferqueue": "TransferQueueInstrumentor", "mooncake": "MooncakeInstrumentor",
            "verl": "VerlInstrumentor", "ray": "RayInstrumentor"}


def test_own_calls_marks_the_block_only():
    assert not is_own_call()
    with own_calls():
        assert is_own_call()
        with own_calls():
            assert is_own_call()
        assert is_own_call()  # the inner block restores the outer mark, not "unmarked"
    assert not is_own_call()
    try:
        with own_calls():
            raise KeyError
    except KeyError:
        pass
    assert not is_own_call()
    assert own(is_own_call)() and not is_own_call()


def test_the_mark_stays_on_its_thread_but_rides_into_submitted_coroutines():
    # Why the adapters set it on the thread that makes the calls: an executor's thread does
    # not see it; a coroutine submitted from a marked thread to a loop elsewhere does.
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    async def seen():
        return is_own_call()

    async def from_executor():
        with own_calls():
            return await asyncio.get_running_loop().run_in_executor(pool, is_own_call)

    try:
        with ThreadPoolExecutor(1) as pool:
            assert asyncio.run(from_executor()) is False
            with own_calls():
                assert pool.submit(is_own_call).result() is False
                assert asyncio.run_coroutine_threadsafe(seen(), loop).result() is True
            assert asyncio.run_coroutine_threadsafe(seen(), loop).result() is False
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


def test_own_calls_proxy_marks_every_method_call_on_any_thread():
    store = types.SimpleNamespace(get=lambda key: (key, is_own_call()), size=3)
    own_store = OwnCalls(store)
    assert own_store.size == 3
    assert own_store.get("k") == ("k", True)
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(own_store.get, "t").result() == ("t", True)
    assert store.get("k") == ("k", False)  # the store itself is left as it was


def _requirements(specs) -> set[tuple[str, str]]:
    return {(r.name.lower().replace("_", "-"), str(r.specifier))
            for r in map(Requirement, specs)}


def test_each_package_declares_what_its_extra_installs():
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name, cls in PACKAGES.items():
        package = importlib.import_module(f"dpobs_otel.adapters.{name}.package")
        instrumentor = getattr(importlib.import_module(f"dpobs_otel.adapters.{name}"), cls)
        declared = tuple(instrumentor().instrumentation_dependencies())
        if not package._instruments:  # several distributions of one module: no extra can
            assert name not in extras, name  # name "any one of them" (pyproject.toml)
            assert len(declared) == 1 and declared[0] in package._instruments_any, name
            continue
        assert declared == package._instruments
        assert _requirements(extras[name]) == _requirements(package._instruments), name


def test_mooncake_declares_the_distribution_that_provides_its_module():
    provides = importlib.metadata.packages_distributions().get("mooncake")
    if not provides:
        pytest.skip("no mooncake distribution installed")
    [declared] = MooncakeInstrumentor().instrumentation_dependencies()
    assert declared.split()[0] == provides[0]


def _probe_instrumentor(requirement: str):
    """A fresh Instrumentor (one per class: a singleton) that supports `requirement` and
    counts its _instrument calls."""
    class Probe(Instrumentor):
        calls = 0

        def instrumentation_dependencies(self):
            return (requirement,)

        def _instrument(self, **kwargs):
            type(self).calls += 1

        def _uninstrument(self, **kwargs):
            pass
    return Probe


def test_a_library_out_of_range_is_left_unmeasured_and_said_once(caplog):
    installed = importlib.metadata.version("transferqueue")
    probe = _probe_instrumentor("transferqueue >= 99.0, < 100")
    with caplog.at_level(logging.WARNING, logger="dpobs_otel.adapters.instrumentation"):
        probe().instrument()
        probe().uninstrument()
        probe().instrument()
    assert probe.calls == 0
    [said] = [r.getMessage() for r in caplog.records if "left unmeasured" in r.getMessage()]
    assert f"transferqueue {installed}" in said and "transferqueue >= 99.0, < 100" in said
    missing = _probe_instrumentor("no-such-library >= 1.0, < 2")
    missing().instrument()
    assert missing.calls == 0


def test_a_library_in_range_is_instrumented():
    installed = importlib.metadata.version("transferqueue")
    probe = _probe_instrumentor(f"transferqueue >= {installed}, < 99")
    probe().instrument()
    probe().uninstrument()
    assert probe.calls == 1


def test_entry_points_and_dpobs_auto_name_each_package_s_instrumentor():
    points = PYPROJECT["project"]["entry-points"]["opentelemetry_instrumentor"]
    assert points == {"transfer_queue": "dpobs_otel.adapters.transferqueue:"
                                        "TransferQueueInstrumentor",
                      "mooncake": "dpobs_otel.adapters.mooncake:MooncakeInstrumentor",
                      "verl": "dpobs_otel.adapters.verl:VerlInstrumentor",
                      "verl_steps": "dpobs_otel.adapters.verl:VerlStepInstrumentor",
                      "ray": "dpobs_otel.adapters.ray:RayInstrumentor"}
    for target in points.values():
        where, cls = target.split(":")
        assert issubclass(getattr(importlib.import_module(where), cls), Instrumentor)
    assert {f"dpobs_otel.adapters.{m}:{c}" for m, c in auto.TARGETS.values()} == set(
        points.values())


def test_importing_a_package_imports_its_instrumentor_alone():
    # The OpenTelemetry launcher imports every entry point's package at start-up.
    code = ("import sys, dpobs_otel.adapters.transferqueue, dpobs_otel.adapters.mooncake\n"
            "import dpobs_otel.adapters.verl, dpobs_otel.adapters.ray\n"
            "print(sorted(m for m in ('torch', 'transfer_queue', 'mooncake', 'tensordict',"
            " 'verl', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_dpobs_starts_on_first_call_and_again_in_a_forked_child(tmp_path, monkeypatch):
    from dpobs_otel.adapters.instrumentation import UNBUILT, PerProcess
    from dpobs_otel.adapters.transferqueue import InstrumentedTransferQueue
    from dpobs_otel.adapters.transferqueue.instrumentor import _Originals

    for var in ("DPOBS_PORT", "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_SD_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DPOBS_ROLE", "forked")
    listing = {"p": {"a": {}, "b": {}}}
    module = types.SimpleNamespace(kv_list=lambda partition_id=None: listing)
    originals = _Originals(module, {"kv_list": module.kv_list})
    per_process = PerProcess(lambda tel: InstrumentedTransferQueue(tel, originals), "test")
    assert per_process.started is None  # importing and instrumenting start nothing
    try:
        assert per_process.adapter().kv_list("p") == listing
        parent = per_process.started
        assert per_process.current is per_process.adapter()  # what Ray's wrappers read
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its first call starts its own dpobs
            code = 1
            try:
                fresh = per_process.current is UNBUILT  # the parent's adapter is not the child's
                per_process.adapter().kv_list("p")
                child = per_process.started
                s = scrape(child)
                fresh = fresh and per_process.current is per_process.adapter()
                os.write(w, json.dumps([child.endpoint, value(s, OPS, op="list"),
                                        fresh]).encode())
                child.shutdown()
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            child_endpoint, child_lists, fresh = json.loads(f.read() or "[null, 0, false]")
        assert os.waitpid(pid, 0)[1] == 0
        assert child_endpoint not in (None, parent.endpoint) and child_lists == 1 and fresh
        assert value(scrape(parent), OPS, op="list") == 1  # the child's call is not here
        assert value(scrape(parent), KEYS, op="list") == 2
    finally:
        per_process.close()


