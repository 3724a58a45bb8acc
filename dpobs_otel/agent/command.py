"""`dpobs agent`: the per-node (or per-pod) sidecar. It is the real `prometheus` binary in
agent mode, not a forwarder of our own: the agent scrapes every process of this node that
registered itself in a file_sd directory (`dpobs.start(sd_dir=...)` / DPOBS_SD_DIR), keeps a
write-ahead log, and remote-writes to any Prometheus remote-write receiver with the external
label `node`, so two processes on different nodes that publish the same host:port stay two
processes.

This module is the command: its arguments, and run(), which validates them, renders the
config (config.py) next to the agent's WAL and runs the binary (process.py) until it exits.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import tempfile

from ..names import ALERT_AGENT_DELIVERY_FAILING
from .config import (DEFAULT_LISTEN, NATIVE_MODES, AgentError, TLSFiles, agent_config,
                     check_listen, node_config, parse_header, render, without_native)
from .process import _version, agent_flag, command, find_binary, header_warning, supervise
from .watch import Watch

TIERS = ("agent", "node")
NODE_RULES_FILE = "dpobs-node.rules.yml"


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
    p.add_argument("--native-histograms", choices=NATIVE_MODES, default="auto",
                   help="send the op duration's native histogram in a queue of its own: "
                   "auto (default) until the receiver refuses it, then classic series only; "
                   f"always (keep retrying; {ALERT_AGENT_DELIVERY_FAILING} fires); never")
    p.add_argument("--delivery-error-after", type=float, default=60.0, metavar="SECONDS",
                   help="print an error when a queue had no batch accepted for this long "
                   "while its sends fail (default 60)")
    p.add_argument("--delivery-error-every", type=float, default=300.0, metavar="SECONDS",
                   help="and again this often while it lasts (default 300)")
    rw = p.add_argument_group("remote write (what Mimir, Cortex, Thanos, VictoriaMetrics need)")
    rw.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                    help="extra header, repeatable (e.g. 'X-Scope-OrgID: team-a')")
    rw.add_argument("--bearer-token-file", metavar="PATH")
    rw.add_argument("--basic-auth-username", metavar="USER")
    rw.add_argument("--basic-auth-password-file", metavar="PATH")
    _tls_arguments(rw, "remote-write", "the receiver")
    sc = p.add_argument_group("scraping processes started with DPOBS_TLS_*")
    _tls_arguments(sc, "scrape", "the processes' endpoints (turns on https)")
    p.add_argument("--tier", choices=TIERS, default="agent",
                   help="agent (default): forward every series to the receiver, which "
                   "evaluates every rule; node: a Prometheus server that evaluates the "
                   "mixin's node rules over this node's processes and sends their results "
                   "with the raw series but the bucket families (docs/guides/node-tier.md; "
                   "the receiver then loads dpobs-central.rules.yml)")
    p.add_argument("--node-rules", metavar="PATH", help="with --tier node: the node rules "
                   "file `dpobs mixin` wrote for your Config (default: the default Config's)")
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
    common = dict(listen=args.listen, headers=dict(map(parse_header, args.header)),
                  bearer_token_file=args.bearer_token_file, basic_auth=basic,
                  tls=_tls(args, "remote_write"), scrape_tls=_tls(args, "scrape"),
                  native=args.native_histograms != "never")
    where = (args.sd_dir, args.remote_write, args.node or socket.gethostname(),
             args.scrape_interval)
    if args.tier == "agent":
        if args.node_rules:
            raise AgentError("--node-rules needs --tier node")
        return agent_config(*where, **common)
    from ..mixin.node_tier import NOT_SENT
    return node_config(*where, rule_files=[_node_rules_path(args)], not_sent=NOT_SENT,
                       **common)


def _node_rules_path(args) -> str:
    """--node-rules, or the default Config's node rules beside the storage (written by
    write_node_rules before the binary starts)."""
    if args.node_rules:
        if not os.path.isfile(args.node_rules):
            raise AgentError(f"--node-rules {args.node_rules}: no such file")
        return os.path.abspath(args.node_rules)
    return os.path.join(_storage(args), NODE_RULES_FILE)


def write_node_rules(path: str) -> None:
    from ..mixin.config import DEFAULT
    from ..mixin.node_tier import node_file
    with open(path, "w") as f:
        f.write(node_file(DEFAULT))


def _storage(args) -> str:
    node = args.node or socket.gethostname()
    return args.storage_path or os.path.join(
        tempfile.gettempdir(), f"dpobs-agent-{_safe(node)}-{check_listen(args.listen)[1]}")


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
    storage = _storage(args)
    os.makedirs(storage, exist_ok=True)
    os.makedirs(args.sd_dir, exist_ok=True)
    if args.tier == "node" and not args.node_rules:
        write_node_rules(os.path.join(storage, NODE_RULES_FILE))
    config_file = os.path.join(storage, "dpobs-agent.yml")
    with open(config_file, "w") as f:
        f.write(render(cfg))
    argv = command(binary, version, config_file, storage, args.listen, args.prometheus_arg,
                   tier=args.tier)
    return supervise(argv, args.sd_dir, args.cleanup_interval,
                     _watch(args, cfg, config_file))


def _watch(args, cfg: dict, config_file: str) -> Watch:
    """The queues' watch; in auto mode a native refusal rewrites the config without the
    native queue (the supervisor then reloads prometheus), so its WAL segments are not
    kept for a queue retried forever."""
    def drop_native(err: str) -> None:
        with open(config_file, "w") as f:
            f.write(render(without_native(cfg)))
        print(f"dpobs agent: {args.remote_write} refuses native histograms ({err}); "
              "reloading without the native queue: classic series only from now on "
              "(--native-histograms never skips the attempt)", file=sys.stderr, flush=True)
    host, port = check_listen(args.listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return Watch(args.remote_write, f"http://{host}:{port}/metrics",
                 stall_s=args.delivery_error_after, repeat_s=args.delivery_error_every,
                 on_native_refused=drop_native if args.native_histograms == "auto" else None)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


