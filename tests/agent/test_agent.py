"""`dpobs agent`: the config it renders (validated by promtool), the flag each Prometheus
major wants, the errors it refuses to start with, and, with the real binary on loopback:
buffering while the receiver is down, what reaches the receiver (node label, headers, auth,
TLS), scraping TLS endpoints, signal forwarding, and sweeping targets of dead processes."""
from __future__ import annotations

import base64
import http.server
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import dpobs_otel as dpobs
from dpobs_otel.cli import main
from dpobs_otel.agent.config import (CLASSIC_QUEUE, NATIVE_QUEUE, AgentError, TLSFiles,
                                     agent_config, check_url, parse_header, without_native)
from dpobs_otel.agent.watch import SENT, Watch, failures, log_fields, sent_timestamps
from dpobs_otel.agent.process import agent_flag, binary_version, header_warning
from dpobs_otel.names import OP_DURATION_NATIVE_SERIES
from dpobs_otel.exporters.filesd import boot_id
from dpobs_otel.readback.prometheus import Prometheus, PrometheusError
from dpobs_otel.testing.netns import Client
from dpobs_otel.testing.processes import free_port
from dpobs_otel.testing.prometheus import Agent, Central

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None and os.environ.get("CI") != "true",
                                      reason="prometheus not on PATH (apt-get install prometheus)")
URL = "http://127.0.0.1:9/api/v1/write"


# -- the config ---------------------------------------------------------------------------
def test_config_discovers_the_directory_and_labels_the_node(tmp_path):
    cfg = agent_config(str(tmp_path), URL, "gpu-node-7", "5s")
    assert cfg["global"] == {"scrape_interval": "5s", "external_labels": {"node": "gpu-node-7"}}
    [dpobs_job, self_job] = cfg["scrape_configs"]
    assert dpobs_job["file_sd_configs"][0]["files"] == [str(tmp_path / "*.json")]
    assert dpobs_job["scrape_timeout"] == "5s" and "scheme" not in dpobs_job
    assert self_job["static_configs"] == [{"targets": ["127.0.0.1:9095"]}]
    [rw, native] = cfg["remote_write"]
    assert rw["url"] == URL and rw["queue_config"]["retry_on_http_429"] is True
    assert not {"headers", "authorization", "basic_auth", "tls_config"} & set(rw)
    # the classic queue never carries a native histogram; the native queue nothing else
    assert rw["send_native_histograms"] is False
    assert rw["write_relabel_configs"] == [{"source_labels": ["__name__"], "action": "drop",
                                            "regex": OP_DURATION_NATIVE_SERIES}]
    assert native["send_native_histograms"] is True and native["url"] == URL
    assert native["write_relabel_configs"][0]["action"] == "keep"
    assert native["write_relabel_configs"][0]["regex"] == OP_DURATION_NATIVE_SERIES
    assert native["metadata_config"] == {"send": False}
    assert [q["name"] for q in without_native(cfg)["remote_write"]] == [CLASSIC_QUEUE]
    assert [q["name"] for q in agent_config(str(tmp_path), URL, "n", native=False)[
        "remote_write"]] == [CLASSIC_QUEUE]


def test_config_carries_headers_auth_and_tls(tmp_path):
    tls = TLSFiles(ca_file="/ca.pem", cert_file="/c.pem", key_file="/c.key")
    cfg = agent_config(str(tmp_path), URL, "n", headers={"X-Scope-OrgID": "t1"},
                       bearer_token_file="/tok", tls=tls, scrape_tls=TLSFiles(ca_file="/s.pem"))
    for rw in cfg["remote_write"]:  # both queues: the native one is sent as the classic
        assert rw["headers"] == {"X-Scope-OrgID": "t1"}
        assert rw["authorization"] == {"type": "Bearer", "credentials_file": "/tok"}
        assert rw["tls_config"] == {"ca_file": "/ca.pem", "cert_file": "/c.pem",
                                    "key_file": "/c.key", "insecure_skip_verify": False}
    job = cfg["scrape_configs"][0]
    assert job["scheme"] == "https"
    assert job["tls_config"] == {"ca_file": "/s.pem", "insecure_skip_verify": False}
    basic = agent_config(str(tmp_path), URL, "n", basic_auth=("u", "/pw"))["remote_write"][0]
    assert basic["basic_auth"] == {"username": "u", "password_file": "/pw"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(bearer_token_file="/t", basic_auth=("u", "/p")), "not both"),
    (dict(basic_auth=("u", "")), "password file"),
    (dict(tls=TLSFiles(cert_file="/c")), "both its cert file and its key file"),
    (dict(listen="nowhere"), "HOST:PORT"),
])
def test_config_refuses_contradictions(tmp_path, kwargs, message):
    with pytest.raises(AgentError, match=message):
        agent_config(str(tmp_path), URL, "n", **kwargs)


@pytest.mark.parametrize("url", ["127.0.0.1:9090", "ftp://h/x", "http://", "http://h:99999/",
                                 "http://h:0/", "http://h:x/"])
def test_malformed_urls_are_refused(url):
    with pytest.raises(AgentError, match="malformed remote-write URL"):
        check_url(url)


@pytest.mark.parametrize("bad", ["0s", "15", "fast", ""])
def test_bad_durations_are_refused(tmp_path, bad):
    with pytest.raises(AgentError, match="not a Prometheus duration"):
        agent_config(str(tmp_path), URL, "n", bad)


def test_headers_parse_like_curl_and_reserved_ones_are_refused():
    assert parse_header("X-Scope-OrgID:  team-a ") == ("X-Scope-OrgID", "team-a")
    with pytest.raises(AgentError, match="bearer-token-file"):
        parse_header("Authorization: Bearer x")
    for bad in ("no colon", ": v", "X-Empty:", "Content-Type: x"):
        with pytest.raises(AgentError):
            parse_header(bad)


@needs_prometheus
def test_printed_config_is_what_promtool_accepts_in_agent_mode(tmp_path, capsys):
    for f in ("tok", "ca.pem"):
        (tmp_path / f).write_text("x")
    code = main(["agent", "--sd-dir", str(tmp_path / "sd"), "--remote-write", URL,
                 "--node", "n", "--print-config", "--header", "X-Scope-OrgID: t1",
                 "--bearer-token-file", str(tmp_path / "tok"),
                 "--remote-write-ca-file", str(tmp_path / "ca.pem"),
                 "--scrape-ca-file", str(tmp_path / "ca.pem")])
    out = capsys.readouterr().out
    assert code == 0
    assert yaml.safe_load(out)["remote_write"][0]["headers"] == {"X-Scope-OrgID": "t1"}
    (tmp_path / "agent.yml").write_text(out)
    check = subprocess.run(["promtool", "check", "config", "--agent", str(tmp_path / "agent.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# -- the binary -----------------------------------------------------------------------------
def fake_prometheus(tmp_path: Path, version: str, exit_code: int = 0) -> str:
    """A stand-in binary that prints a version and records the arguments it was run with."""
    path = tmp_path / f"prometheus-{version}"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'prometheus, version "
                    f"{version} (branch: HEAD)'; exit 0; fi\necho \"$@\" > {tmp_path}/args\n"
                    f"exit {exit_code}\n")
    path.chmod(0o755)
    return str(path)


def test_debian_builds_are_named_when_headers_would_be_dropped():
    text = "version 2.42.0+ds"
    assert "13030" in header_warning(text, {"X-Scope-OrgID": "t"})
    assert header_warning(text, {}) is None
    assert header_warning("version 2.53.1", {"X-Scope-OrgID": "t"}) is None


def test_agent_flag_follows_the_major_version():
    assert agent_flag((2, 42)) == "--enable-feature=agent"
    assert agent_flag((3, 1)) == "--agent"
    with pytest.raises(AgentError, match="no agent mode"):
        agent_flag((2, 31))


@pytest.mark.parametrize("version, flag", [("3.1.0", "--agent"),
                                           ("2.53.1", "--enable-feature=agent")])
def test_runs_the_binary_with_its_flag_and_exits_with_its_code(tmp_path, version, flag):
    binary = fake_prometheus(tmp_path, version, exit_code=7)
    assert binary_version(binary) == tuple(map(int, version.split(".")[:2]))
    code = main(["agent", "--sd-dir", str(tmp_path / "sd"), "--remote-write", URL,
                 "--node", "n", "--prometheus", binary,
                 "--storage-path", str(tmp_path / "wal")])
    assert code == 7
    args = (tmp_path / "args").read_text().split()
    assert args[0] == flag and "--enable-feature=native-histograms" in args
    assert f"--storage.agent.path={tmp_path / 'wal'}" in args
    assert "--web.listen-address=127.0.0.1:9095" in args
    assert yaml.safe_load((tmp_path / "wal" / "dpobs-agent.yml").read_text())["global"][
        "external_labels"] == {"node": "n"}


def test_node_tier_runs_a_server_with_the_node_rules(tmp_path):
    """--tier node: no agent flag, a TSDB, the default Config's node rules written beside it
    and loaded, and the bucket families kept from the receiver (mixin/node_tier.py)."""
    from dpobs_otel.mixin.config import DEFAULT
    from dpobs_otel.mixin.node_tier import NOT_SENT, node_file
    binary = fake_prometheus(tmp_path, "2.53.1", exit_code=0)
    code = main(["agent", "--tier", "node", "--sd-dir", str(tmp_path / "sd"),
                 "--remote-write", URL, "--node", "n", "--prometheus", binary,
                 "--storage-path", str(tmp_path / "tsdb")])
    assert code == 0
    args = (tmp_path / "args").read_text().split()
    assert "--enable-feature=agent" not in args and "--agent" not in args
    assert f"--storage.tsdb.path={tmp_path / 'tsdb'}" in args
    cfg = yaml.safe_load((tmp_path / "tsdb" / "dpobs-agent.yml").read_text())
    rules = tmp_path / "tsdb" / "dpobs-node.rules.yml"
    assert cfg["rule_files"] == [str(rules)] and rules.read_text() == node_file(DEFAULT)
    dropped = [r["regex"] for r in cfg["remote_write"][0]["write_relabel_configs"]
               if r["action"] == "drop"]
    assert "|".join(NOT_SENT) in dropped
    assert cfg["global"]["external_labels"] == {"node": "n"}


def test_node_tier_config_is_what_promtool_accepts_as_a_server(tmp_path, capsys):
    (tmp_path / "mine.rules.yml").write_text(node_file_text())
    code = main(["agent", "--tier", "node", "--node-rules", str(tmp_path / "mine.rules.yml"),
                 "--sd-dir", str(tmp_path / "sd"), "--remote-write", URL, "--node", "n",
                 "--print-config"])
    out = capsys.readouterr().out
    assert code == 0
    (tmp_path / "node.yml").write_text(out)
    check = subprocess.run(["promtool", "check", "config", str(tmp_path / "node.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def node_file_text() -> str:
    from dpobs_otel.mixin.config import DEFAULT
    from dpobs_otel.mixin.node_tier import node_file
    return node_file(DEFAULT)


def test_node_rules_without_the_node_tier_is_refused(tmp_path, capsys):
    code = main(["agent", "--node-rules", str(tmp_path / "x.yml"), "--sd-dir", str(tmp_path),
                 "--remote-write", URL, "--node", "n", "--print-config"])
    assert code == 2 and "--tier node" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--prometheus", "/nonexistent/prometheus"], "prometheus binary not found"),
    (["--remote-write", "localhost:9090"], "malformed remote-write URL"),
    (["--header", "Authorization: Bearer x"], "--bearer-token-file"),
])
def test_missing_binary_and_malformed_url_exit_2_with_a_message(tmp_path, capsys, argv, message):
    base = ["agent", "--sd-dir", str(tmp_path), "--remote-write", URL, "--node", "n"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err


# -- with the real binary ---------------------------------------------------------------------
@pytest.fixture
def workload(tmp_path, monkeypatch):
    """A process of this node: registered in tmp_path/sd, 5 puts and 3 gets measured."""
    for var in ("DPOBS_SD_DIR", "DPOBS_JOB", "OTEL_SERVICE_NAME", "DPOBS_PORT", "DPOBS_HOST"):
        monkeypatch.delenv(var, raising=False)
    tel = dpobs.start(role="trainer", rank=1, job="agent-test", sd_dir=str(tmp_path / "sd"))
    client = tel.instrument(dpobs.InMemoryDataPlane())
    import torch
    from tensordict import TensorDict
    for i in range(5):
        client.put_samples([f"s{i}"], "p", TensorDict({"x": torch.zeros(1, 4)}, batch_size=[1]))
    for i in range(3):
        client.get_samples([f"s{i}"], "p")
    yield tel
    tel.shutdown()


def wait_for(fn, timeout: float = 60, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def up_targets(agent: Agent, job: str) -> list[dict]:
    """The agent's healthy targets of scrape job `job` (whatever job label their file_sd
    gives them), once it has some (its targets API)."""
    prom = Prometheus(f"http://{agent.listen}", timeout=10)

    def healthy():
        try:
            active = prom.targets(state="any")
        except PrometheusError:  # not listening yet
            return []
        return [t for t in active if t["scrapePool"] == job and t["health"] == "up"]
    return wait_for(healthy, timeout=60)


@pytest.mark.slow
@needs_prometheus
def test_receiver_down_at_start_is_buffered_then_delivered_with_the_node_label(tmp_path,
                                                                              workload):
    port = free_port()
    with Agent(str(tmp_path / "sd"), f"http://127.0.0.1:{port}/api/v1/write", "node-x") as agent:
        up_targets(agent, "dpobs")  # scraping (targets reach the scrape loop within ~5 s)
        time.sleep(5)  # several scrapes with nobody to receive them
        assert agent.proc.poll() is None, agent.log()  # a down receiver is not an error
        before = time.time()
        with Central([], port=port) as central:
            sel = 'dpobs_client_operation_duration_seconds_count{job="agent-test"}'
            got = wait_for(lambda: central.query(sel + ' >= 3'))
            assert {(r["metric"]["op"], r["metric"]["node"], r["metric"]["role"],
                     r["metric"]["rank"], r["value"]) for r in got} == \
                {("put", "node-x", "trainer", "1", 5.0), ("get", "node-x", "trainer", "1", 3.0)}
            # the native histogram too (the agent's flag, send_native_histograms, the
            # receiver's flag), node kept
            native = wait_for(lambda: central.query(
                f'histogram_count({OP_DURATION_NATIVE_SERIES}{{job="agent-test"}}) >= 3'))
            assert {(r["metric"]["op"], r["metric"]["node"], r["value"]) for r in native} == \
                {("put", "node-x", 5.0), ("get", "node-x", 3.0)}
            # the scrapes made while the receiver was down arrived from the WAL
            early = central.query(f"count_over_time({sel}[60s])", at=before)
            assert early and min(r["value"] for r in early) >= 3, early
            up = wait_for(lambda: central.query('up{job="dpobs-agent", node="node-x"} == 1'))
            assert len(up) == 1


@pytest.mark.slow
@needs_prometheus
def test_sigterm_is_forwarded_and_the_exit_code_passed_on(tmp_path):
    with Agent(str(tmp_path / "sd"), URL, "n") as agent:
        client = Client()
        wait_for(lambda: client.text(f"http://{agent.listen}/-/ready"), timeout=30)
        children = Path(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children")
        [child] = map(int, children.read_text().split())
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=30) == 0  # Prometheus exits 0 on SIGTERM
        assert not Path(f"/proc/{child}").exists() or \
            Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        client.close()


CHILD = """
import sys, time, dpobs_otel as d
t = d.start(role="doomed", sd_dir=sys.argv[1]); print(t.endpoint, flush=True); time.sleep(600)
"""


@pytest.mark.slow
@needs_prometheus
@pytest.mark.skipif(boot_id() is None, reason="needs Linux's boot id")
def test_agent_sweeps_targets_of_killed_processes_at_start_and_while_running(tmp_path):
    sd = tmp_path / "sd"

    def doomed():
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(sd)], stdout=subprocess.PIPE,
                             text=True)
        p.stdout.readline()
        return p
    first = doomed()
    first.kill()
    first.wait()
    stale = {p.name for p in sd.glob("*.json")}
    assert len(stale) == 1  # left behind by SIGKILL
    with Agent(str(sd), URL, "n") as agent:
        wait_for(lambda: not list(sd.glob("*.json")), timeout=30)
        second = doomed()
        assert len(list(sd.glob("*.json"))) == 1
        time.sleep(2.5)  # a couple of cleanup intervals: a live process keeps its file
        assert len(list(sd.glob("*.json"))) == 1
        second.kill()
        second.wait()
        wait_for(lambda: not list(sd.glob("*.json")), timeout=30)
        assert "its process is gone" in agent.log()


class Capture(http.server.BaseHTTPRequestHandler):
    """A remote-write receiver that keeps the headers of every request and answers 204."""
    seen: list = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(self.headers)  # a Message: names match case-insensitively
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def certs(tmp_path):
    crt, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    return str(crt), str(key)


def receiver(tls: tuple[str, str] | None = None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("C", (Capture,),
                                                                     {"seen": []}))
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow
@needs_prometheus
def test_receiver_gets_headers_bearer_token_and_tls(tmp_path, certs, monkeypatch):
    (tmp_path / "token").write_text("s3cret\n")
    server = receiver(tls=certs)
    url = f"https://127.0.0.1:{server.server_address[1]}/api/v1/write"
    # the process itself serves https: the agent must scrape it with the CA
    for var in ("DPOBS_SD_DIR", "DPOBS_JOB", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)
    tel = dpobs.start(role="tls", sd_dir=str(tmp_path / "sd"), tls_certfile=certs[0],
                      tls_keyfile=certs[1])
    extra = ["--header", "X-Scope-OrgID: tenant-1", "--bearer-token-file",
             str(tmp_path / "token"), "--remote-write-ca-file", certs[0],
             "--scrape-ca-file", certs[0]]
    try:
        with Agent(str(tmp_path / "sd"), url, "n", extra=extra) as agent:
            got = wait_for(lambda: server.RequestHandlerClass.seen, timeout=60)
            assert got[0]["Authorization"] == "Bearer s3cret"
            assert got[0]["Content-Encoding"] == "snappy"  # a real remote-write request
            [target] = up_targets(agent, "dpobs")
            assert target["scrapeUrl"] == f"https://{tel.endpoint}/metrics"
            if "+ds" in subprocess.run([PROMETHEUS, "--version"], capture_output=True,
                                       text=True).stdout:
                assert "prometheus/prometheus#13030" in agent.log()  # the user is told
                assert got[0]["X-Scope-OrgID"] is None  # the Debian bug, still there
            else:
                assert got[0]["X-Scope-OrgID"] == "tenant-1"
    finally:
        tel.shutdown()
        server.shutdown()


@pytest.mark.slow
@needs_prometheus
def test_receiver_gets_basic_auth(tmp_path):
    (tmp_path / "pw").write_text("hunter2")
    server = receiver()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/write"
    extra = ["--basic-auth-username", "alice", "--basic-auth-password-file",
             str(tmp_path / "pw")]
    try:
        with Agent(str(tmp_path / "sd"), url, "n", extra=extra):
            got = wait_for(lambda: server.RequestHandlerClass.seen, timeout=60)
            want = "Basic " + base64.b64encode(b"alice:hunter2").decode()
            assert got[0]["Authorization"] == want
    finally:
        server.shutdown()


# -- the watch on the queues -------------------------------------------------------------------
REFUSED = ('ts=2026-12-03T06:00:37.521Z caller=dedupe.go:112 component=remote level=warn '
           'remote_name={q} url=http://c/api/v1/write msg="Failed to send batch, retrying" '
           'err="server returned HTTP status 500 Internal Server Error: {answer}"\n')


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_log_fields_undo_logfmt_quoting():
    line = REFUSED.format(q=CLASSIC_QUEUE, answer='say \\"no\\"')
    f = log_fields(line)
    assert f["remote_name"] == CLASSIC_QUEUE and f["msg"] == "Failed to send batch, retrying"
    assert f["err"].endswith('say "no"')
    assert sent_timestamps('x{a="b"} 1\n' + SENT + '{remote_name="q",url="u"} 17.5\n') == \
        {"q": 17.5}


def test_a_stalled_queue_is_one_error_then_one_every_repeat(capsys):
    clock = Clock()
    w = Watch("http://c/api/v1/write", "http://127.0.0.1:9/metrics", stall_s=60, repeat_s=300,
              clock=clock)
    w.accepted({CLASSIC_QUEUE: 5.0})
    w.line(REFUSED.format(q=CLASSIC_QUEUE, answer="overloaded"))
    for dt in (30, 29):  # under a minute: nothing yet
        clock.t += dt
        w.report()
    assert capsys.readouterr().err == ""
    clock.t += 1
    w.report()
    w.report()
    err = capsys.readouterr().err
    assert err.count("dpobs agent: error:") == 1
    assert "queue dpobs-central for 60 s" in err and "500 Internal Server Error: overloaded" in err
    clock.t += 299
    w.report()
    assert capsys.readouterr().err == ""
    clock.t += 1
    w.report()
    assert capsys.readouterr().err.count("for 360 s") == 1
    w.accepted({CLASSIC_QUEUE: 6.0})  # a batch accepted: the failure is over
    clock.t += 600
    w.report()
    assert capsys.readouterr().err == ""
    # failing again with the same answer, which prometheus does not log twice in a minute:
    # its retry counter says so
    text = ('prometheus_remote_storage_samples_retried_total{remote_name="%s",url="u"} %d\n'
            'prometheus_remote_storage_histograms_retried_total{remote_name="%s",url="u"} 0\n')
    w.failed(failures(text % (CLASSIC_QUEUE, 10, CLASSIC_QUEUE)))
    w.failed(failures(text % (CLASSIC_QUEUE, 10, CLASSIC_QUEUE)))
    clock.t += 60
    w.report()
    assert capsys.readouterr().err == ""  # no new failures: not failing
    w.failed(failures(text % (CLASSIC_QUEUE, 25, CLASSIC_QUEUE)))
    clock.t += 60
    w.report()
    assert "for 60 s; its last answer: server returned HTTP status 500" in capsys.readouterr().err


def test_only_a_native_refusal_of_the_native_queue_ends_it_once():
    calls = []
    w = Watch("u", "m", on_native_refused=calls.append)
    w.line(REFUSED.format(q=CLASSIC_QUEUE, answer="native histograms are disabled"))
    w.line(REFUSED.format(q=NATIVE_QUEUE, answer="out of memory"))
    assert calls == [] and not w.reload.is_set()
    for _ in range(2):
        w.line(REFUSED.format(q=NATIVE_QUEUE, answer="native histograms are disabled"))
    assert calls == ["server returned HTTP status 500 Internal Server Error: native histograms "
                     "are disabled"]
    assert w.reload.is_set() and NATIVE_QUEUE not in w.failing_since
    # a 4xx naming them (Prometheus drops that batch: "non-recoverable error") ends it too
    four = Watch("u", "m", on_native_refused=calls.append)
    four.line(f'level=error remote_name={NATIVE_QUEUE} msg="non-recoverable error" count=3 '
              'err="server returned HTTP status 400 Bad Request: native histograms disabled"')
    assert four.reload.is_set() and len(calls) == 2


class Refuse(http.server.BaseHTTPRequestHandler):
    """A receiver that answers every write 503 (an overloaded or broken one)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(503)
        self.end_headers()
        self.wfile.write(b"all ingesters are gone\n")

    def log_message(self, *a):
        pass


@pytest.mark.slow
@needs_prometheus
def test_total_failure_is_one_clear_error_then_again_while_it_lasts(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/write"
    extra = ["--delivery-error-after", "3", "--delivery-error-every", "8"]
    try:
        with Agent(str(tmp_path / "sd"), url, "n", extra=extra) as agent:
            def errors():
                return [ln for ln in agent.log().splitlines()
                        if ln.startswith("dpobs agent: error:")]
            first = wait_for(errors, timeout=60)
            assert f"{url} has accepted no batch of queue {CLASSIC_QUEUE}" in first[0]
            assert "503 Service Unavailable: all ingesters are gone" in first[0]
            both = wait_for(lambda: len(errors()) >= 2 and errors(), timeout=30)
            assert len(both) == 2, both  # not one per failed send: one per period
            agent.kill()  # a graceful stop would wait out the flush deadline on the refusals
    finally:
        server.shutdown()
