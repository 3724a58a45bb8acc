"""The agent's Prometheus config: agent_config() is a pure function of the node's file_sd
directory, the remote-write receiver and the node's name (the mixin writes an example of
it, mixin/agent_example.py), with the checks every argument gets before anything starts."""
from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

import yaml

from ..names import OP_DURATION_NATIVE_SERIES

DEFAULT_LISTEN = "127.0.0.1:9095"
SCRAPE_JOB = "dpobs"
SELF_JOB = "dpobs-agent"
# Two queues to the one receiver: the classic series (everything but the native family)
# and the native histograms alone. A receiver without native histograms refuses a whole
# batch that holds one (Prometheus 2.x without the flag answers 500 and keeps nothing of
# it), so the native family never shares a batch with a classic series.
CLASSIC_QUEUE = "dpobs-central"
NATIVE_QUEUE = "dpobs-central-native"
NATIVE_MODES = ("auto", "always", "never")
# The agent's own series it forwards: enough to see it deliver, lag or drop (its full
# self-metrics are ~1000 series per node, which the central side would pay for). `up` and
# scrape_* are kept anyway: metric relabeling does not apply to them.
SELF_METRICS = ("process_cpu_seconds_total|process_resident_memory_bytes|"
                "prometheus_agent_active_series|prometheus_remote_storage_samples_total|"
                "prometheus_remote_storage_samples_failed_total|"
                "prometheus_remote_storage_samples_retried_total|"
                "prometheus_remote_storage_samples_dropped_total|"
                "prometheus_remote_storage_samples_pending|"
                "prometheus_remote_storage_histograms_total|"
                "prometheus_remote_storage_histograms_failed_total|"
                "prometheus_remote_storage_histograms_retried_total|"
                "prometheus_remote_storage_histograms_pending|"
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
    """The classic queue: every series but the native family, no native histograms."""
    rw: dict = {
        "url": check_url(url),
        "name": CLASSIC_QUEUE,
        "remote_timeout": "30s",
        # Recoverable failures (connection refused, 5xx, and 429 here) retry forever with
        # backoff while the WAL holds the samples: a central restart loses nothing. Shards
        # grow with the backlog, so a replay after an outage drains in a few sends.
        "queue_config": {"capacity": 10000, "min_shards": 1, "max_shards": 50,
                         "max_samples_per_send": 2000, "batch_send_deadline": "5s",
                         "min_backoff": "30ms", "max_backoff": "5s",
                         "retry_on_http_429": True},
        "metadata_config": {"send": True, "send_interval": "1m"},
        "write_relabel_configs": [{"source_labels": ["__name__"],
                                   "regex": OP_DURATION_NATIVE_SERIES, "action": "drop"}],
        "send_native_histograms": False,
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


def native_queue(classic: dict) -> dict:
    """The native queue: the same receiver, auth, TLS and headers as `classic`, carrying only
    the op duration's native histogram (scraped with the agent's native-histograms flag).
    Its own WAL position and retries: a receiver refusing it never holds a classic batch."""
    rw = {k: v for k, v in classic.items() if k not in ("write_relabel_configs",
                                                         "metadata_config")}
    rw["name"] = NATIVE_QUEUE
    rw["queue_config"] = dict(classic["queue_config"], max_shards=5)
    rw["metadata_config"] = {"send": False}  # the classic queue sends it once
    rw["write_relabel_configs"] = [{"source_labels": ["__name__"],
                                    "regex": OP_DURATION_NATIVE_SERIES, "action": "keep"}]
    rw["send_native_histograms"] = True
    return rw


def without_native(config: dict) -> dict:
    """`config` with its native queue removed (what the agent reloads with when the receiver
    refuses native histograms)."""
    return dict(config, remote_write=[rw for rw in config["remote_write"]
                                      if rw["name"] != NATIVE_QUEUE])


def agent_config(sd_dir: str, remote_write_url: str, node: str, scrape_interval: str = "15s",
                 *, listen: str = DEFAULT_LISTEN, headers: dict[str, str] | None = None,
                 bearer_token_file: str | None = None,
                 basic_auth: tuple[str, str] | None = None, tls: TLSFiles | None = None,
                 scrape_tls: TLSFiles | None = None, native: bool = True) -> dict:
    """The agent's Prometheus config. Pure: validates and returns a dict, touches nothing.

    Targets keep the labels their file gives them (job, role, rank); `node` is an external
    label, added to every sample the agent sends. The agent also scrapes itself (job
    dpobs-agent, a dozen series) so the central side can tell that a node's agent delivers.
    Two remote-write queues (native=False: the classic one only), see CLASSIC_QUEUE."""
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
    classic = _remote_write(remote_write_url, headers, bearer_token_file, basic_auth, tls)
    return {
        "global": {"scrape_interval": scrape_interval, "external_labels": {"node": node}},
        "scrape_configs": [dpobs_job, self_job],
        "remote_write": [classic] + ([native_queue(classic)] if native else []),
    }


def node_config(sd_dir: str, remote_write_url: str, node: str, scrape_interval: str = "15s",
                *, rule_files: list[str], not_sent: tuple[str, ...], **agent) -> dict:
    """The node tier's Prometheus config (`dpobs agent --tier node`, the mixin's
    prometheus/node.yml): the agent's scrape jobs, queues and external label, run as a
    server that evaluates `rule_files` (the mixin's node rules) every scrape interval and
    sends their results with every raw series but the families in `not_sent`, which the
    central rules read only through the node's parts (mixin/node_tier.py)."""
    config = agent_config(sd_dir, remote_write_url, node, scrape_interval, **agent)
    drop = {"source_labels": ["__name__"], "regex": "|".join(not_sent), "action": "drop"}
    classic = dict(config["remote_write"][0])
    classic["write_relabel_configs"] = classic["write_relabel_configs"] + [drop]
    config["global"]["evaluation_interval"] = scrape_interval
    return dict(config, rule_files=list(rule_files),
                remote_write=[classic] + config["remote_write"][1:])


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
