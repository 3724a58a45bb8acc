"""`dpobs agent`: the per-node (or per-pod) sidecar. It is the real `prometheus` binary in
agent mode, not a forwarder of our own: the agent scrapes every process of this node that
registered itself in a file_sd directory (`dpobs.start(sd_dir=...)` / DPOBS_SD_DIR), keeps a
write-ahead log, and remote-writes to any Prometheus remote-write receiver with the external
label `node`, so two processes on different nodes that publish the same host:port stay two
processes.

agent_config() is a pure function (the mixin writes an example of it); run() validates,
renders the config next to the agent's WAL, starts the binary in the foreground, forwards
SIGTERM/SIGINT to it, exits with its code, and meanwhile sweeps the directory of targets
whose processes died without removing their file (see filesd.py).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass

import yaml

from .filesd import sweep

DEFAULT_LISTEN = "127.0.0.1:9095"
SCRAPE_JOB = "dpobs"
SELF_JOB = "dpobs-agent"
# The agent's own series it forwards: enough to see it deliver, lag or drop (its full
# self-metrics are ~1000 series per node, which the central side would pay for). `up` and
# scrape_* are kept anyway: metric relabeling does not apply to them.
SELF_METRICS = ("process_cpu_seconds_total|process_resident_memory_bytes|"
                "prometheus_agent_active_series|prometheus_remote_storage_samples_total|"
                "prometheus_remote_storage_samples_failed_total|"
                "prometheus_remote_storage_samples_retried_total|"
                "prometheus_remote_storage_samples_dropped_total|"
                "prometheus_remote_storage_samples_pending|"
                "prometheus_remote_storage_highest_timestamp_in_seconds|"
                "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
# Headers Prometheus sets itself or refuses in remote_write.headers.
RESERVED_HEADERS = {"authorization", "host", "content-encoding", "content-length",
                    "content-type", "user-agent", "connection", "keep-alive",
                    "proxy-authenticate", "proxy-authorization", "www-authenticate",
                    "accept-encoding", "x-prometheus-remote-write-version"}
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


class AgentError(ValueError):
    """A configuration the agent refuses to start with (exit status 2)."""


@dataclass(frozen=True)
class TLSFiles:
    """A Prometheus tls_config: files, not secrets inline, so the config can be printed."""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False

    def __bool__(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file, self.server_name,
                    self.insecure_skip_verify))

    def config(self) -> dict:
        if (self.cert_file is None) != (self.key_file is None):
            raise AgentError("a client certificate needs both its cert file and its key file")
        out = {k: v for k, v in (("ca_file", self.ca_file), ("cert_file", self.cert_file),
                                 ("key_file", self.key_file), ("server_name", self.server_name))
               if v}
        out["insecure_skip_verify"] = bool(self.insecure_skip_verify)
        return out


def check_url(url: str) -> str:
    """A remote-write URL Prometheus can use: http(s), a host, a valid port."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        raise AgentError(f"malformed remote-write URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(f"malformed remote-write URL {url!r}: want http(s)://HOST[:PORT]/PATH")
    if port == 0:
        raise AgentError(f"malformed remote-write URL {url!r}: port 0")
    return url


def check_duration(text: str, what: str) -> str:
    if not _DURATION.match(text) or _seconds(text) <= 0:
        raise AgentError(f"{what} {text!r} is not a Prometheus duration (e.g. 15s, 1m)")
    return text


def check_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AgentError(f"--listen {listen!r}: want HOST:PORT")
    return host, int(port)


def parse_header(text: str) -> tuple[str, str]:
    """'Name: value' (as curl -H takes it)."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.match(name) or not value:
        raise AgentError(f"--header {text!r}: want 'Name: value'")
    if name.lower() in RESERVED_HEADERS:
        raise AgentError(f"--header {name}: Prometheus sets this header itself"
                         + ("; use --bearer-token-file or --basic-auth-*"
                            if name.lower() == "authorization" else ""))
    return name, value


def _remote_write(url: str, headers: dict[str, str] | None, bearer_token_file: str | None,
                  basic_auth: tuple[str, str] | None, tls: TLSFiles | None) -> dict:
    rw: dict = {
        "url": check_url(url),
        "name": "dpobs-central",
        "remote_timeout": "30s",
        # Recoverable failures (connection refused, 5xx, and 429 here) retry forever with
        # backoff while the WAL holds the samples: a central restart loses nothing. Shards
        # grow with the backlog, so a replay after an outage drains in a few sends.
        "queue_config": {"capacity": 10000, "min_shards": 1, "max_shards": 50,
                         "max_samples_per_send": 2000, "batch_send_deadline": "5s",
                         "min_backoff": "30ms", "max_backoff": "5s",
                         "retry_on_http_429": True},
        "metadata_config": {"send": True, "send_interval": "1m"},
    }
    if headers:
        rw["headers"] = dict(headers)
    if bearer_token_file and basic_auth:
        raise AgentError("choose bearer-token or basic auth for remote write, not both")
    if bearer_token_file:
        rw["authorization"] = {"type": "Bearer", "credentials_file": bearer_token_file}
    if basic_auth:
        user, password_file = basic_auth
        if not user or not password_file:
            raise AgentError("basic auth needs a username and a password file")
        rw["basic_auth"] = {"username": user, "password_file": password_file}
    if tls:
        rw["tls_config"] = tls.config()
    return rw


def agent_config(sd_dir: str, remote_write_url: str, node: str, scrape_interval: str = "15s",
                 *, listen: str = DEFAULT_LISTEN, headers: dict[str, str] | None = None,
                 bearer_token_file: str | None = None,
                 basic_auth: tuple[str, str] | None = None, tls: TLSFiles | None = None,
                 scrape_tls: TLSFiles | None = None) -> dict:
    """The agent's Prometheus config. Pure: validates and returns a dict, touches nothing.

    Targets keep the labels their file gives them (job, role, rank); `node` is an external
    label, added to every sample the agent sends. The agent also scrapes itself (job
    dpobs-agent, a dozen series) so the central side can tell that a node's agent delivers."""
    if not node:
        raise AgentError("node name must not be empty")
    check_duration(scrape_interval, "scrape interval")
    check_listen(listen)
    dpobs_job: dict = {
        "job_name": SCRAPE_JOB,
        "file_sd_configs": [{"files": [os.path.join(os.path.abspath(sd_dir), "*.json")],
                             # inotify sees new files at once; this is the fallback re-read
                             "refresh_interval": "30s"}],
        "scrape_interval": scrape_interval,
        "scrape_timeout": _timeout(scrape_interval),
    }
    if scrape_tls:  # processes started with DPOBS_TLS_CERTFILE/KEYFILE (and CLIENT_CAFILE)
        dpobs_job["scheme"] = "https"
        dpobs_job["tls_config"] = scrape_tls.config()
    self_job = {
        "job_name": SELF_JOB,
        "static_configs": [{"targets": [listen]}],
        "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": SELF_METRICS,
                                    "action": "keep"}],
    }
    return {
        "global": {"scrape_interval": scrape_interval, "external_labels": {"node": node}},
        "scrape_configs": [dpobs_job, self_job],
        "remote_write": [_remote_write(remote_write_url, headers, bearer_token_file,
                                       basic_auth, tls)],
    }


def _timeout(interval: str) -> str:
    """Prometheus's own default (10s), capped by the interval it must fit in."""
    seconds = _seconds(interval)
    return interval if seconds < 10 else "10s"


def _seconds(duration: str) -> float:
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration))


def render(config: dict) -> str:
    return "# Generated by `dpobs agent`; rerun it rather than editing.\n" + \
        yaml.safe_dump(config, sort_keys=False)


# -- the binary ---------------------------------------------------------------------------
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
            listen: str, extra: list[str] = ()) -> list[str]:
    return [binary, agent_flag(version), f"--config.file={config_file}",
            f"--storage.agent.path={storage}", f"--web.listen-address={listen}", *extra]


# -- the command --------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sd-dir", required=True, help="the node-local file_sd directory "
                   "every process writes into (DPOBS_SD_DIR)")
    p.add_argument("--remote-write", required=True, metavar="URL",
                   help="remote-write receiver, e.g. http://central:9090/api/v1/write")
    p.add_argument("--node", help="external label node (default: this host's name)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"the agent's own web address (default {DEFAULT_LISTEN})")
    p.add_argument("--scrape-interval", default="15s", metavar="DURATION")
    p.add_argument("--prometheus", metavar="PATH", help="the binary (default: on PATH)")
    p.add_argument("--storage-path", metavar="DIR", help="the agent's WAL (default: "
                   "<tmp>/dpobs-agent-<node>-<port>; keep it across restarts to replay)")
    p.add_argument("--print-config", action="store_true", help="print the config and exit")
    p.add_argument("--cleanup-interval", type=float, default=30.0, metavar="SECONDS",
                   help="how often to remove targets of dead processes (default 30)")
    rw = p.add_argument_group("remote write (what Mimir, Cortex, Thanos, VictoriaMetrics need)")
    rw.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                    help="extra header, repeatable (e.g. 'X-Scope-OrgID: team-a')")
    rw.add_argument("--bearer-token-file", metavar="PATH")
    rw.add_argument("--basic-auth-username", metavar="USER")
    rw.add_argument("--basic-auth-password-file", metavar="PATH")
    _tls_arguments(rw, "remote-write", "the receiver")
    sc = p.add_argument_group("scraping processes started with DPOBS_TLS_*")
    _tls_arguments(sc, "scrape", "the processes' endpoints (turns on https)")
    p.add_argument("--prometheus-arg", action="append", default=[], metavar="ARG",
                   help="passed to prometheus unchanged, repeatable (e.g. --log.level=debug)")


def _tls_arguments(group, prefix: str, whose: str) -> None:
    group.add_argument(f"--{prefix}-ca-file", metavar="PATH", help=f"CA that signed {whose}")
    group.add_argument(f"--{prefix}-cert-file", metavar="PATH", help="client certificate")
    group.add_argument(f"--{prefix}-key-file", metavar="PATH", help="client key")
    group.add_argument(f"--{prefix}-server-name", metavar="NAME")
    group.add_argument(f"--{prefix}-insecure-skip-verify", action="store_true",
                       help="do not verify the server certificate (off by default)")


def _tls(args, prefix: str) -> TLSFiles:
    get = lambda k: getattr(args, f"{prefix}_{k}")  # noqa: E731
    return TLSFiles(get("ca_file"), get("cert_file"), get("key_file"), get("server_name"),
                    get("insecure_skip_verify"))


def config_from_args(args) -> dict:
    if bool(args.basic_auth_username) != bool(args.basic_auth_password_file):
        raise AgentError("basic auth needs both --basic-auth-username and "
                         "--basic-auth-password-file")
    basic = (args.basic_auth_username, args.basic_auth_password_file) \
        if args.basic_auth_username else None
    return agent_config(args.sd_dir, args.remote_write, args.node or socket.gethostname(),
                        args.scrape_interval, listen=args.listen,
                        headers=dict(map(parse_header, args.header)),
                        bearer_token_file=args.bearer_token_file, basic_auth=basic,
                        tls=_tls(args, "remote_write"), scrape_tls=_tls(args, "scrape"))


def run(args) -> int:
    try:
        cfg = config_from_args(args)
        if args.print_config:
            sys.stdout.write(render(cfg))
            return 0
        binary = find_binary(args.prometheus)
        version, version_text = _version(binary)
        agent_flag(version)
    except AgentError as exc:
        print(f"dpobs agent: error: {exc}", file=sys.stderr)
        return 2
    warning = header_warning(version_text, cfg["remote_write"][0].get("headers"))
    if warning:
        print(f"dpobs agent: warning: {warning}", file=sys.stderr, flush=True)
    node = cfg["global"]["external_labels"]["node"]
    storage = args.storage_path or os.path.join(
        tempfile.gettempdir(), f"dpobs-agent-{_safe(node)}-{check_listen(args.listen)[1]}")
    os.makedirs(storage, exist_ok=True)
    os.makedirs(args.sd_dir, exist_ok=True)
    config_file = os.path.join(storage, "dpobs-agent.yml")
    with open(config_file, "w") as f:
        f.write(render(cfg))
    argv = command(binary, version, config_file, storage, args.listen, args.prometheus_arg)
    return supervise(argv, args.sd_dir, args.cleanup_interval)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def supervise(argv: list[str], sd_dir: str, cleanup_interval: float) -> int:
    """Run argv in the foreground until it exits; forward SIGTERM/SIGINT; sweep sd_dir at
    start and every cleanup_interval seconds. Returns the child's exit status (128+N when
    a signal N ended it, as a shell reports it)."""
    _report_swept(sweep(sd_dir, node_local=True))
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    forwarded = {}
    def forward(signum, _frame):
        child.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        forwarded[sig] = signal.signal(sig, forward)
    try:
        while True:
            try:
                code = child.wait(timeout=max(cleanup_interval, 0.1))
                break
            except subprocess.TimeoutExpired:
                _report_swept(sweep(sd_dir, node_local=True))
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)
    return 128 - code if code < 0 else code


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

