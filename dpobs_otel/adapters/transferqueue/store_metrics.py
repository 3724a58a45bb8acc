"""TransferQueue's own Prometheus exporter beside dpobs's: turned on when asked, and its
endpoint registered for file_sd next to the measured processes (docs/guides/transferqueue.md,
"The store's own account").

Asked: with DPOBS_TQ_METRICS=1 (Settings.tq_metrics) a measured transfer_queue.init passes
metrics.enabled=True to TransferQueue when the user's config leaves it unset (an explicit
True or False is the user's and is kept; the user's config object is never changed: a copy
goes in). Without it (the default) the config reaches TransferQueue untouched: dpobs never
turns the exporter on by itself. It only matters where init creates the controller:
TransferQueue ignores the config of a process that joins an existing one.

Registered: after a measured init, a process with an sd_dir looks the endpoint up (in the
config init returned, else get_metrics_endpoint(): one Ray call to the controller) and, when
the exporter is on and the controller runs on this host, announces it in the sd_dir as a
SharedFileSDTarget: the same JSON target format as every process's file, labels `job` and
`role` (tq-controller), no `rank`, file `tq-controller-<job>-<ip>_<port>@<boot id>.0.json`.
Every measured process of the job on that host writes the same name, so N processes make one
file and one target; it stays while any of them lives, and close() (which kills the
controller) removes it. Only processes on the controller's host announce it (the endpoint's
IP is one this host can bind): with node-local sd_dirs (`dpobs agent` on each node) the
controller's own node's agent scrapes it and gives it that node's `node` label, as it does for
every process there, while processes on other nodes would have made their agents scrape the
same controller again under their own node labels. The file itself carries no `node`.

Harmless: dpobs's part never fails init() or close(). A config edit that fails leaves the
user's config (counted, component=adapter); a failed lookup or write is counted under
component=file_sd; TransferQueue's own exceptions propagate as they are; init returns what
TransferQueue returned (the user's own object where TransferQueue hands back the config it
was given). With dpobs off none of this runs: the adapter is then the module itself.
"""
from __future__ import annotations

import os
import re
import socket
import threading

from ... import names
from ...exporters.filesd import SharedFileSDTarget

__all__ = ["ROLE", "StoreMetrics", "measured_init", "with_exporter", "announce", "release",
           "on_this_host"]

ROLE = names.ROLE_TQ_CONTROLLER  # the role label of the controller's target
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # what a file name may not hold

# (pid, sd_dir, file name) -> this process's announcement; a forked child holds none of its
# parent's (SharedFileSDTarget.remove leaves the parent's file alone there).
_held: dict[tuple, SharedFileSDTarget] = {}
_held_lock = threading.Lock()


class StoreMetrics:
    """Mixed into InstrumentedTransferQueue (its _tel, _tq): TransferQueue's init and close
    with the store's exporter and its registration."""

    def init(self, conf=None):
        return measured_init(self._tel, self._tq, conf)

    def close(self):
        release(self._tel, force=True)  # the controller goes with it, whoever announced it
        return self._tq.close()


def measured_init(tel, tq, conf=None):
    """tq.init(conf), with the exporter when asked and its endpoint announced."""
    sent = conf
    if tel.settings.tq_metrics and hasattr(tq, "get_metrics_endpoint"):  # 0.1.6 has none
        try:
            sent = with_exporter(conf)
        except Exception as exc:
            tel.internal_error(names.COMPONENT_ADAPTER, exc)
    out = tq.init(sent)
    _discover(tel, tq, out)
    return conf if out is sent and sent is not conf else out


def with_exporter(conf):
    """conf with metrics.enabled=True as a new object, or conf itself when the user set
    metrics.enabled. conf: None, a dict or an OmegaConf DictConfig (what init takes)."""
    if conf is None:
        return {"metrics": {"enabled": True}}
    metrics = conf.get("metrics")
    if metrics is not None and metrics.get("enabled") is not None:
        return conf
    if isinstance(conf, dict):
        return {**conf, "metrics": {**(metrics or {}), "enabled": True}}
    from omegaconf import OmegaConf  # a DictConfig: TransferQueue's own dependency

    return OmegaConf.merge(conf, {"metrics": {"enabled": True}})


def _discover(tel, tq, out) -> None:
    s = tel.settings
    lookup = getattr(tq, "get_metrics_endpoint", None)
    if not s.sd_dir or lookup is None:
        return
    try:
        endpoint = _endpoint_in(out) or lookup()
        if endpoint:
            announce(s, str(endpoint))
    except Exception as exc:
        tel.internal_error(names.COMPONENT_FILE_SD, exc)


def _endpoint_in(conf):
    """metrics.endpoint of a config init returned (the creator's), else None."""
    try:
        return conf["metrics"]["endpoint"]
    except Exception:  # None, the user's config of a joining process, a missing key
        return None


def announce(settings, endpoint: str) -> SharedFileSDTarget | None:
    """This process's announcement of the controller at endpoint ("ip:port") in
    settings.sd_dir; None when the controller runs on another host."""
    if not on_this_host(endpoint.rpartition(":")[0]):
        return None
    name = "tq-controller-" + _UNSAFE.sub("_", f"{settings.job}-{endpoint}")
    key = (os.getpid(), settings.sd_dir, name)
    with _held_lock:
        held = _held.get(key)
        if held is None:
            held = _held[key] = SharedFileSDTarget(
                settings.sd_dir, endpoint, {"job": settings.job, "role": ROLE}, name)
        return held


def release(tel, force: bool = False) -> None:
    """Stop announcing every controller this process announces (force: remove the files
    whoever else announces them: the controller is going). Never raises."""
    with _held_lock:
        mine = [k for k in _held if k[0] == os.getpid()]
        targets = [_held.pop(k) for k in mine]
    for target in targets:
        try:
            target.remove(force=force)
        except Exception as exc:
            tel.internal_error(names.COMPONENT_FILE_SD, exc)


def on_this_host(host: str) -> bool:
    """Is host (an IP address) one of this host's own: can a socket bind it?"""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_DGRAM,
                                   flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr)  # port 0: bound for an instant, nothing sent
            return True
        except OSError:
            continue
    return False
