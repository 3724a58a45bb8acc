"""dpobs_otel.readback.scrape: discovery from file_sd files, parsing against prometheus_client's own
parser and the process's own aggregates, failures mapped (never raised), https."""
from __future__ import annotations

import http.server
import json
import math
import os
import socket
import threading

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.readback import buckets, scrape
from dpobs_otel.exporters.filesd import boot_id


def work(tel, rows: int = 3):
    raw = dpobs.InMemoryDataPlane()
    client = tel.instrument(raw)
    with tel.step():
        ids = [str(i) for i in range(rows)]
        client.put_samples(ids, "p", TensorDict({"x": torch.ones(rows, 5)}, batch_size=[rows]))
        client.get_samples(ids, "p")
        with pytest.raises(KeyError):
            client.get_samples(["nope"], "p")
        client.list_sample_ids("p")
        with tel.codec("unpack"):
            pass
    return client


def test_parse_equals_the_full_parser_and_the_process_own_aggregates(clean_env, tmp_path):
    tel = dpobs.start(role="r", rank=1, port=0, verify_tensor_hash=True)
    try:
        work(tel)
        [t] = [scrape.Target(tel.endpoint, (("job", "dpobs"),))]
        body = scrape.fetch(t)
        fast = scrape.parse(body)
        full = scrape.totals_from_samples(scrape._full_samples(body))
        assert fast == full
        st = tel.stats
        for op, s in st.ops.items():
            o = fast.ops[op]
            assert (o.calls, o.errors, o.read_bytes, o.write_bytes, o.keys, o.missing) == (
                s.calls, s.errors, s.read_bytes, s.write_bytes, s.keys, s.missing), op
            assert o.seconds == s.seconds and o.buckets[math.inf] == s.calls
        assert fast.ops["get"].errors == 1 and fast.ops["put"].write_bytes == 3 * 5 * 4
        assert (fast.steps, fast.step_seconds) == (st.steps, st.step_seconds)
        assert fast.codec_seconds == st.codec_seconds
        assert fast.instrumentation_seconds == pytest.approx(st.instr_seconds, rel=1e-12)
        assert fast.outstanding_bytes == 60 and fast.outstanding_keys == 3
        assert fast.guard["rows_recorded"] == 3 and fast.guard["rows_checked"] == 3
        assert fast.guard["rows_mismatched"] == 0 and fast.instance_id
    finally:
        tel.shutdown()


def test_parse_handles_escapes_and_odd_label_values():
    body = ('dpobs_client_keys_total{op="a}b\\"c",x="{"} 7.0\n'
            'dpobs_client_keys_total{op="plain"} 2.5 1700000000000\n'
            'dpobs_step_duration_seconds_count 4\n'
            'something_else{op="x"} 99\n')
    fast = scrape.parse(body)
    assert fast == scrape.totals_from_samples(scrape._full_samples(body))
    assert fast.ops['a}b"c'].keys == 7 and fast.ops["plain"].keys == 2.5 and fast.steps == 4
    assert fast.guard is None  # no guard series: absent, not zeros


def write_sd(path, targets, labels):
    path.write_text(json.dumps([{"targets": targets, "labels": labels}]))


def test_targets_identity_liveness_and_filters(clean_env, tmp_path):
    sd = tmp_path / "sd"
    tel = dpobs.start(role="trainer", rank=3, job="j1", port=0, sd_dir=str(sd))
    try:
        me = boot_id()
        write_sd(sd / f"dead@{me}.12345.json", ["127.0.0.1:1"], {"job": "j1", "role": "x"})
        write_sd(sd / "foreign.json", ["127.0.0.1:2", "127.0.0.1:3"],
                 {"job": "j2", "node": "n1", "role": "y", "rank": "0"})
        (sd / "broken.json").write_text("[{not json")
        (sd / "notes.txt").write_text("ignored")
        got = {t.address: t for t in scrape.targets(str(sd))}
        assert set(got) == {tel.endpoint, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
        live = got[tel.endpoint]
        assert live.alive is True and live.label("role") == "trainer"
        assert live.process == ("j1", "", tel.endpoint, "trainer", "3")
        ticks = scrape._OWNED.search(os.path.basename(live.file))["start"]
        assert live.incarnation == f"{me}.{ticks}"
        assert got["127.0.0.1:1"].alive is False  # nobody holds its lock
        assert got["127.0.0.1:2"].alive is None and got["127.0.0.1:2"].incarnation is None
        assert got["127.0.0.1:3"].process == ("j2", "n1", "127.0.0.1:3", "y", "0")
        assert {t.address for t in scrape.targets(str(sd), job="j1")} == {
            tel.endpoint, "127.0.0.1:1"}
        assert scrape.targets(str(tmp_path / "missing")) == []
        # a store's own exporter registered beside the processes is not a dpobs process
        write_sd(sd / "tq-controller-j1.json", ["127.0.0.1:4"],
                 {"job": "j1", "role": names.ROLE_TQ_CONTROLLER})
        assert "127.0.0.1:4" not in {t.address for t in scrape.targets(str(sd))}
        assert "127.0.0.1:4" in {t.address for t in scrape.targets(str(sd), stores=True)}
    finally:
        tel.shutdown()


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *a):
        pass


def test_scrape_all_maps_every_failure_and_never_raises(clean_env):
    tel = dpobs.start(role="ok", rank=0, port=0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]  # closed again below: nobody listens
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ts = [scrape.Target(a, ()) for a in (
            tel.endpoint, f"127.0.0.1:{silent.getsockname()[1]}", f"127.0.0.1:{refused}",
            f"127.0.0.1:{server.server_address[1]}")]
        got = scrape.scrape_all(ts, timeout=0.3)
        assert isinstance(got[ts[0]], scrape.ProcessTotals)
        assert isinstance(got[ts[1]], (TimeoutError, socket.timeout))
        assert isinstance(got[ts[2]], ConnectionRefusedError)
        assert isinstance(got[ts[3]], scrape.ScrapeError) and "404" in str(got[ts[3]])
        assert scrape.scrape_all([]) == {}
    finally:
        server.shutdown()
        silent.close()
        tel.shutdown()


@pytest.fixture
def certs(tmp_path):
    """A self-signed certificate for 127.0.0.1, its own CA (made with cryptography)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp_path / "c.crt", tmp_path / "c.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return str(crt), str(pem)


def test_mutual_tls_endpoints_are_scraped_over_https_per_settings(clean_env, tmp_path, certs):
    crt, key = certs
    sd = str(tmp_path / "sd")
    tls = dict(tls_certfile=crt, tls_keyfile=key, tls_client_cafile=crt)
    worker = dpobs.start(role="w", rank=0, port=0, sd_dir=sd, **tls)
    driver = dpobs.start(role="d", rank=0, port=0, sd_dir=sd, **tls)
    try:
        work(worker)
        [t] = [t for t in scrape.targets(sd) if t.label("role") == "w"]
        plain = scrape.scrape_all([t], timeout=1)[t]
        assert isinstance(plain, Exception)  # an http request to an https endpoint
        no_cert = scrape.scrape_all([t], timeout=1, ssl_context=scrape.tls_context(crt))[t]
        assert isinstance(no_cert, Exception)  # the endpoint wants a client certificate
        got = driver.cluster_step_metrics(sd)
        assert got["dpobs/cluster/processes"] == 2
        assert got["dpobs/cluster/op/put/calls"] == 1 and got["dpobs/cluster/steps"] == 1
    finally:
        worker.shutdown()
        driver.shutdown()


def test_quantile_interpolates_like_prometheus():
    b = {0.1: 2.0, 0.2: 6.0, 0.4: 10.0, math.inf: 10.0}
    assert buckets.quantile(b, 0.5) == pytest.approx(0.1 + 0.1 * (5 - 2) / 4)
    assert buckets.quantile(b, 0.1) == pytest.approx(0.1 * 1 / 2)
    assert buckets.quantile(b, 1.0) == pytest.approx(0.4)
    assert buckets.quantile({0.1: 0.0, math.inf: 4.0}, 0.5) == 0.1  # in +Inf: the last bound
    assert math.isnan(buckets.quantile({0.1: 0.0, math.inf: 0.0}, 0.5))


def test_went_back_is_the_restart_test():
    a = scrape.parse("dpobs_client_keys_total{op=\"get\"} 5\ndpobs_step_duration_seconds_count 3\n"
                     'target_info{service_instance_id="one"} 1\n')
    later = scrape.parse("dpobs_client_keys_total{op=\"get\"} 6\ndpobs_step_duration_seconds_count 4\n"
                         'target_info{service_instance_id="one"} 1\n')
    assert not later.went_back(a)
    assert scrape.parse(later_text := "dpobs_client_keys_total{op=\"get\"} 4\n").went_back(a)
    other = scrape.parse(later_text.replace("4", "9") + 'target_info{service_instance_id="two"} 1\n'
                         "dpobs_step_duration_seconds_count 9\n")
    assert other.went_back(a)  # counters ahead, but another process
    assert scrape.parse("dpobs_step_duration_seconds_count 4\n").went_back(a)  # op gone
