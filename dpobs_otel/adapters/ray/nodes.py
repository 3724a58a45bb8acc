"""Ray's own exporters discovered beside dpobs's processes (DESIGN.md, "Ray's object store as a
data plane").

Each Ray node serves its own account of the object store (memory by location, spilling,
pulls, the object manager's bytes) on its metrics export port, but Ray writes a file_sd file
for those ports (prom_metrics_service_discovery.json) only where its dashboard runs, and a
plain `pip install ray` has none. So a measured driver with an sd_dir announces every alive
node's port there itself, once Ray is connected and the port answers (a bare Ray lists a port
its missing agent never serves): one file per node,
`ray-node-<job>-<ip>_<port>@<boot id>.0.json`, in the same JSON target format as every
process's file, with labels job, role ray-node (names.STORE_ROLES: dpobs's readers skip it),
node (Ray's NodeAddress, the IP Ray labels its own series with) and dpobs_source=ray (the
rules' selector). The configs need nothing more: they already read every *.json there.

Only drivers announce: a driver sees every node of its cluster, and workers are many. The
list is read again every REFRESH_S (nodes that joined are added, dead ones dropped; sooner
while a listed port does not answer yet); the files
go when Ray disconnects (ray.shutdown()) or the driver exits, however it exits: each is a
SharedFileSDTarget, so two drivers of one job on a host share one file and the last one out
removes it, and a sweep removes it once no announcer lives (exporters/filesd.py).

Harmless: nothing here runs on an op's way (a daemon thread does the work), and a failure is
counted under component file_sd, never raised.
"""
from __future__ import annotations

import re
import socket
import threading
from time import monotonic

from ... import names
from ...exporters.filesd import SharedFileSDTarget

__all__ = ["NodeTargets", "announce", "exporters"]

REFRESH_S = 30.0  # how often a connected driver reads Ray's node list again
POLL_S = 0.5  # how often it looks whether Ray is connected (a flag read, no call to Ray)
PROBE_S = 1.0  # how long a node's exporter has to accept a connection
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # what a file name may not hold


def exporters(nodes: list[dict]) -> dict[str, str]:
    """{"ip:port" of each alive node's metrics exporter: its NodeAddress}, from ray.nodes()."""
    out = {}
    for node in nodes:
        address, port = node.get("NodeManagerAddress"), node.get("MetricsExportPort")
        if not node.get("Alive") or not address or not port:
            continue
        host = f"[{address}]" if ":" in address else address  # an IPv6 node
        out[f"{host}:{int(port)}"] = address
    return out


def serving(target: str, timeout: float = PROBE_S) -> bool:
    """Does something accept connections at target ("ip:port", "[ipv6]:port")?"""
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class NodeTargets:
    """The file_sd entries of Ray's node exporters, kept by a daemon thread of this driver."""

    def __init__(self, tel):
        self._tel = tel
        self._sd_dir, self._job = tel.settings.sd_dir, tel.settings.job
        self._held: dict[str, SharedFileSDTarget] = {}  # "ip:port" -> its announcement
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpobs-ray-nodes", daemon=True)

    def start(self) -> "NodeTargets":
        self._thread.start()
        return self

    @property
    def announced(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def _run(self) -> None:
        import ray
        due, wait = 0.0, POLL_S  # when the node list is next read, and the wait before that
        while not self._stop.is_set():
            if ray.is_initialized():
                if monotonic() >= due:
                    # an exporter not serving yet (Ray's agent starts after ray.init
                    # returns): asked again soon, then less and less often
                    wait = min(2 * wait, REFRESH_S) if self.refresh(ray) else REFRESH_S
                    due = monotonic() + wait
            elif due:  # Ray went down (ray.shutdown()): its ports with it
                self._withdraw(self.announced)
                due, wait = 0.0, POLL_S
            self._stop.wait(POLL_S)

    def refresh(self, ray) -> int:
        """Announce the nodes Ray lists now whose exporter serves, and withdraw the ones it
        no longer lists; returns how many listed nodes' exporters did not answer. Ray lists a
        port even where nothing serves it (a bare `pip install ray` has no agent to export):
        announced, it would only be a target that is down."""
        try:
            wanted = exporters(ray.nodes())
        except Exception as exc:
            if ray.is_initialized():  # not a shutdown racing the read
                self._tel.internal_error(names.COMPONENT_FILE_SD, exc)
            return 0
        self._withdraw([a for a in self.announced if a not in wanted])
        silent = 0
        for target, node in wanted.items():
            if target in self._held:
                continue
            if serving(target):
                self._announce(target, node)
            else:
                silent += 1
        return silent

    def _announce(self, target: str, node: str) -> None:
        labels = {"job": self._job, "role": names.ROLE_RAY_NODE, "node": node,
                  names.SOURCE_LABEL: names.SOURCE_RAY}
        name = "ray-node-" + _UNSAFE.sub("_", f"{self._job}-{target}")
        try:
            held = SharedFileSDTarget(self._sd_dir, target, labels, name)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_FILE_SD, exc)
            return
        with self._lock:
            self._held[target] = held

    def _withdraw(self, targets) -> None:
        for target in targets:
            with self._lock:
                held = self._held.pop(target, None)
            try:
                if held is not None:
                    held.remove()  # the last announcer on this host removes the file
            except Exception as exc:
                self._tel.internal_error(names.COMPONENT_FILE_SD, exc)

    def close(self) -> None:
        """Stop, and withdraw every announcement (uninstrument, or a test's end)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._withdraw(self.announced)


def announce(tel) -> NodeTargets | None:
    """Ray's node exporters announced from this process when it is a driver started with an
    sd_dir; None otherwise. Never raises."""
    from ...shims import ray_private
    try:
        if not tel.settings.sd_dir or ray_private.in_worker():
            return None
        return NodeTargets(tel).start()
    except Exception as exc:
        tel.internal_error(names.COMPONENT_FILE_SD, exc)
        return None
