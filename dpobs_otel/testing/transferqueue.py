"""A local Ray + TransferQueue 0.1.11 on loopback, for the demo's transferqueue backend,
`dpobs compare`, the benchmarks and the tests.

Starter process::

    from dpobs_otel.testing.transferqueue import start, stop, call
    handle = start()                    # ray (2 logical CPUs) + tq with ONE storage unit
    try:
        call(tq.kv_batch_put, keys=[...], partition_id="p", fields=td)
        # hand handle.ray_address to a child, e.g. via argv or env
    finally:
        stop()                          # tq.close() + ray.shutdown(), always

Child process (same machine, same user: Ray's auth token lives in ~/.ray)::

    from dpobs_otel.testing.transferqueue import attach, detach
    attach(address)                     # ray.init(address=...) + tq.init() -> client only
    try:
        ...                             # kv_* calls work as in the starter
    finally:
        detach()                        # closes the client only; NEVER tq.close() here

Every blocking step runs under a timeout: TransferQueue's sync API and its
init wait forever (e.g. tq.init hangs in ray.get when a storage unit cannot be
scheduled for lack of CPUs).  ray and transfer_queue are imported lazily, so
importing this module is free in environments without them.

Loopback only: Ray binds 127.0.0.1 (its own traffic never uses the machine's other
interfaces), runs no dashboard, and its usage stats are off (they probe the cloud metadata
service, 169.254.169.254). `_node_ip_address="127.0.0.1"` alone does not do it: Ray turns a
loopback address into the machine's reachable one unless it runs in its local-only mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when ray is imported). `LOOPBACK_ENV` holds these
switches; start() and attach() set them in os.environ before they import ray (importing this
module changes nothing), and children inherit them. A process that imports ray before
either must set them itself first (tests/conftest.py does).

Run ``python -m dpobs_otel.testing.transferqueue`` for a self-check (starter + child process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ..adapters.transferqueue.exporter import COLLECT_INTERVAL_ENV

# The controller and each SimpleStorage unit are Ray actors with num_cpus=1.
NUM_STORAGE_UNITS = 1
METRICS_COLLECT_S = 1  # start(metrics=True): the storage figures a second old at most
NUM_CPUS = 2  # logical; exactly controller + one unit.  Raise it if tests add actors.

LOOPBACK_IP = "127.0.0.1"
# Environment for every process that starts or joins Ray here (set before `import ray`).
LOOPBACK_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# The Ray namespace of the starter and every process that attaches: TransferQueue before
# 0.1.8 names its controller in the driver's namespace (0.1.8 on: "transfer_queue"), so a
# child finds it only in the starter's.
RAY_NAMESPACE = "loopback"  # (the zero-code test holds its script free of "dpobs")

_started_here = False  # True only in the process whose start() created the TQ actors
_attached_here = False


@dataclass(frozen=True)
class TQHandle:
    ray_address: str  # GCS "ip:port": pass to attach() / ray.init(address=...)
    starter_pid: int
    timings: dict[str, float]  # seconds: ray_init, tq_init


def call(fn: Callable[..., Any], *args: Any, timeout_s: float = 30.0, **kwargs: Any) -> Any:
    """Run a blocking call in a daemon thread; raise TimeoutError if it does not return.

    A call that times out keeps its thread (it cannot be killed); the caller
    should then stop() everything.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    name = getattr(fn, "__name__", "call")
    t = threading.Thread(target=run, name=f"tq-call-{name}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{name} did not return within {timeout_s:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def start(timeout_s: float = 240.0, num_cpus: int = NUM_CPUS, metrics: bool = False) -> TQHandle:
    """Start a private local Ray instance and TransferQueue (one storage unit) in this process.
    timeout_s bounds tq.init, whose actors each start a Python that imports torch: a guard
    against a hang, generous because on 2 busy cores (a CI matrix cell's tests beside the next
    cell's virtualenv build) those starts took over 90 s.
    metrics: with TransferQueue's own exporter (0.1.7 on), collecting its storage units'
    figures every METRICS_COLLECT_S unless TQ_METRICS_COLLECT_INTERVAL says otherwise."""
    global _started_here
    os.environ.update(LOOPBACK_ENV)
    if metrics:  # read in the controller's process, which inherits Ray's environment
        os.environ.setdefault(COLLECT_INTERVAL_ENV, str(METRICS_COLLECT_S))
    import ray
    import transfer_queue as tq

    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; call stop() first")
    if num_cpus < 1 + NUM_STORAGE_UNITS:
        raise ValueError(f"num_cpus={num_cpus}: controller + {NUM_STORAGE_UNITS} unit(s) need one CPU each")

    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        # address="local": never join a cluster someone else started on this host
        # (a bare ray.init() follows RAY_ADDRESS or /tmp/ray/ray_current_cluster).
        # Not via call(): Ray ties gcs_server/raylet to the creating THREAD (PR_SET_PDEATHSIG),
        # so starting Ray in a short-lived thread kills the cluster when that thread ends.
        ctx = ray.init(
            address="local",
            num_cpus=num_cpus,
            _node_ip_address=LOOPBACK_IP,
            include_dashboard=False,
            object_store_memory=100 * 1024**2,
            log_to_driver=False,
            namespace=RAY_NAMESPACE,
        )
        timings["ray_init"] = time.perf_counter() - t0
        address = ctx.address_info["gcs_address"]

        t0 = time.perf_counter()
        _started_here = True  # from here on stop() must tear down actors
        conf = {"backend": {"SimpleStorage": {"num_data_storage_units": NUM_STORAGE_UNITS}}}
        if metrics:
            conf["metrics"] = {"enabled": True, "port": 0}
        call(tq.init, conf, timeout_s=timeout_s)
        timings["tq_init"] = time.perf_counter() - t0
    except BaseException:
        stop()
        raise
    return TQHandle(ray_address=address, starter_pid=os.getpid(), timings=timings)


def attach(address: str, timeout_s: float = 60.0, init: Callable | None = None) -> None:
    """In another process: join the starter's Ray cluster and get a TQ client (no new
    controller). init: the module's init to call (a measured one: dpobs then announces the
    controller's exporter), tq.init by default."""
    global _attached_here
    os.environ.update(LOOPBACK_ENV)
    import ray
    import transfer_queue as tq

    try:
        # fails fast if the address is dead
        ray.init(address=address, _node_ip_address=LOOPBACK_IP, log_to_driver=False,
                 namespace=RAY_NAMESPACE)
        # Controller is the named actor "TransferQueueController" in namespace "transfer_queue"
        # (before 0.1.8: the starter's, RAY_NAMESPACE). Check it exists first: if it did not,
        # tq.init() would silently start a second TransferQueue.
        try:
            call(ray.get_actor, "TransferQueueController", namespace="transfer_queue",
                 timeout_s=timeout_s)
        except ValueError:
            call(ray.get_actor, "TransferQueueController", timeout_s=timeout_s)
        _attached_here = True
        call(init or tq.init, timeout_s=timeout_s)  # finds the controller: a client only
    except BaseException:
        detach()
        raise


def detach() -> None:
    """Child side of stop(): close this process's client, leave the controller alone, leave Ray."""
    global _attached_here
    import ray
    import transfer_queue.interface as tqi

    # tq.close() would ray.kill() the shared controller (attach sets interface._TQ_CONTROLLER),
    # so close the client by hand and drop the module's references.
    # (0.1.6 names them _TRANSFER_QUEUE_CLIENT and _TRANSFER_QUEUE_CONTROLLER.)
    prefix = "_TQ_" if hasattr(tqi, "_TQ_CLIENT") else "_TRANSFER_QUEUE_"
    client = getattr(tqi, prefix + "CLIENT")
    setattr(tqi, prefix + "CLIENT", None)
    setattr(tqi, prefix + "CONTROLLER", None)
    try:
        if client is not None:
            call(client.close, timeout_s=15)
    finally:
        _attached_here = False
        if ray.is_initialized():
            ray.shutdown()


def stop() -> None:
    """Tear down whatever this process set up; safe to call more than once and after failures."""
    global _started_here
    if _attached_here:
        detach()
        return
    import ray

    try:
        if _started_here:
            import transfer_queue as tq

            call(tq.close, timeout_s=30)  # kills storage units + controller, closes the client
    except Exception as e:  # ray.shutdown() below takes the actors down anyway
        warnings.warn(f"tq.close() failed: {type(e).__name__}: {e}", stacklevel=2)
    finally:
        _started_here = False
        if ray.is_initialized():
            ray.shutdown()


# ---------------------------------------------------------------- self-check
_CHILD = """
import sys, torch, transfer_queue as tq
from tensordict import TensorDict
from dpobs_otel.testing.transferqueue import attach, detach, call
attach({address!r})
try:
    print("child sees", sorted(call(tq.kv_list, "p")["p"]))
    call(tq.kv_batch_put, keys=["child"], partition_id="p", tags=[{{"by": "child"}}],
         fields=TensorDict({{"x": torch.tensor([[7, 7]])}}, batch_size=1))
finally:
    detach()
"""


def _self_check() -> None:
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    t0 = time.perf_counter()
    handle = start()
    try:
        print(f"started at {handle.ray_address}: {handle.timings}")
        fields = TensorDict({"x": torch.tensor([[1, 1], [2, 2]])}, batch_size=2)
        call(tq.kv_batch_put, keys=["a", "b"], partition_id="p", fields=fields, tags=[{"i": 0}, {"i": 1}])
        code = _CHILD.format(address=handle.ray_address)
        t1 = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        print(f"child rc={child.returncode} in {time.perf_counter() - t1:.1f}s: {child.stdout.strip()}")
        if child.returncode:
            print(child.stderr[-3000:])
        print("starter kv_list:", call(tq.kv_list, "p"))
        got = call(tq.kv_batch_get, keys=["a", "child"], partition_id="p")
        print("starter get:", [r.tolist() for r in got["x"].unbind()])
    finally:
        t1 = time.perf_counter()
        stop()
        print(f"stop {time.perf_counter() - t1:.1f}s, total {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    _self_check()
