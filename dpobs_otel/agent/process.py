"""The Prometheus binary the agent runs: finding it, its version and agent flag, the command
line, and supervise(): the binary in the foreground, SIGTERM/SIGINT forwarded, its exit code
passed on, the file_sd directory swept meanwhile of targets whose processes died without
removing their file (see exporters/filesd.py)."""
from __future__ import annotations

import ctypes
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..exporters.filesd import sweep
from .config import AgentError
from .watch import Watch

POLL_S = 2.0  # how often the queues' progress is read

def find_binary(path: str | None) -> str:
    found = shutil.which(path or "prometheus")
    if found is None:
        raise AgentError(f"prometheus binary not found ({path or 'prometheus'} on PATH); "
                         "install it (Debian: apt-get install prometheus) or pass --prometheus")
    return found


def binary_version(binary: str) -> tuple[int, int]:
    """(major, minor) from `prometheus --version` ("prometheus, version 2.42.0+ds ...")."""
    return _version(binary)[0]


def _version(binary: str) -> tuple[tuple[int, int], str]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AgentError(f"{binary} --version failed: {exc}") from None
    m = re.search(r"version (\d+)\.(\d+)(\S*)", out.stdout + out.stderr)
    if m is None:
        raise AgentError(f"{binary} --version does not say which Prometheus it is: "
                         f"{(out.stdout + out.stderr).strip()[:200]!r}")
    return (int(m[1]), int(m[2])), m[0]


def header_warning(version_text: str, headers: dict) -> str | None:
    """Debian's rebuilds (versions ending in +ds, 2.42 and 2.45 at least) accept
    remote_write.headers and never send them (prometheus/prometheus#13030): a tenant header
    would silently go missing, and Mimir or Cortex answer 401 without it."""
    if headers and "+ds" in version_text:
        return (f"{version_text}: Debian's build does not send remote_write headers "
                f"({', '.join(headers)}); see prometheus/prometheus#13030. Use an upstream "
                "binary (--prometheus PATH) where the receiver needs them")
    return None


def agent_flag(version: tuple[int, int]) -> str:
    """Agent mode is a feature flag in 2.x (since 2.32) and a plain flag from 3.0."""
    if version >= (3, 0):
        return "--agent"
    if version < (2, 32):
        raise AgentError(f"Prometheus {version[0]}.{version[1]} has no agent mode (2.32+)")
    return "--enable-feature=agent"


def command(binary: str, version: tuple[int, int], config_file: str, storage: str,
            listen: str, extra: list[str] = (), tier: str = "agent") -> list[str]:
    # native-histograms: scrape the protobuf exposition and its native histograms (2.x needs
    # the flag; 3.x accepts it), forwarded by the native queue (send_native_histograms).
    # flush-deadline: a reload that drops a queue retried forever (a refused native queue)
    # waits this long for it (default 1m, with the reload and new targets held meanwhile).
    # The node tier is a server (it evaluates rules): a TSDB, kept only as long as its
    # 5m windows and a central outage's replay need, instead of the agent's WAL.
    mode = ([agent_flag(version)], f"--storage.agent.path={storage}") if tier == "agent" else \
        ([], f"--storage.tsdb.path={storage}")
    retention = [] if tier == "agent" else ["--storage.tsdb.retention.time=2h"]
    return [binary, *mode[0], "--enable-feature=native-histograms",
            "--storage.remote.flush-deadline=10s",
            f"--config.file={config_file}", mode[1], *retention,
            f"--web.listen-address={listen}", *extra]


def supervise(argv: list[str], sd_dir: str, cleanup_interval: float,
              watch: Watch | None = None) -> int:
    """Run argv in the foreground until it exits; forward SIGTERM/SIGINT; sweep sd_dir at
    start and every cleanup_interval seconds. With a `watch`, the child's log passes through
    it (and on to stderr), its queues are polled, and a reload it asks for is a SIGHUP.
    Returns the child's exit status (128+N when a signal N ended it, as a shell reports it)."""
    _report_swept(sweep(sd_dir, node_local=True))
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent,
                             stderr=subprocess.PIPE if watch else None)
    if watch:
        threading.Thread(target=_pass_log, args=(child.stderr, watch), daemon=True).start()
    forwarded = {}
    def forward(signum, _frame):
        child.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        forwarded[sig] = signal.signal(sig, forward)
    tick = min(max(cleanup_interval, 0.1), POLL_S) if watch else max(cleanup_interval, 0.1)
    next_sweep = time.monotonic() + cleanup_interval
    try:
        while True:
            try:
                code = child.wait(timeout=tick)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= next_sweep:
                _report_swept(sweep(sd_dir, node_local=True))
                next_sweep = time.monotonic() + cleanup_interval
            if watch:
                if watch.reload.is_set():
                    watch.reload.clear()
                    child.send_signal(signal.SIGHUP)  # prometheus rereads its config
                watch.poll()
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)
    return 128 - code if code < 0 else code


def _pass_log(stream, watch: Watch) -> None:
    """The child's stderr, line by line, to ours and to the watch."""
    for raw in stream:
        text = raw.decode(errors="replace")
        sys.stderr.write(text)
        sys.stderr.flush()
        watch.line(text)


def _die_with_parent() -> None:
    """In the child: the kernel sends it SIGTERM when this wrapper dies, even by SIGKILL, so
    a killed sidecar leaves no agent behind (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _report_swept(paths: list[str]) -> None:
    for path in paths:
        print(f"dpobs agent: removed {path} (its process is gone)", file=sys.stderr,
              flush=True)

