import json
import os
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest
import torch
from conftest import scrape, value
from tensordict import TensorDict

import dpobs_otel as dpobs


def test_file_sd_target_is_valid_and_removed_on_shutdown(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    tel = dpobs.start(role="rollout", rank=3, job="grpo", sd_dir=str(tmp_path))
    try:
        files = list(tmp_path.glob("*.json"))
        assert len(files) == 1 and not list(tmp_path.glob(".*tmp"))
        doc = json.loads(files[0].read_text())
        assert doc == [{"targets": [tel.endpoint],
                        "labels": {"job": "grpo", "role": "rollout", "rank": "3"}}]
        host, port = tel.endpoint.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0  # loopback unless told otherwise
    finally:
        tel.shutdown()
    assert not list(tmp_path.glob("*.json"))


def test_file_sd_removed_at_interpreter_exit(tmp_path):
    code = ("import dpobs_otel as d; t = d.start(role='r', sd_dir=%r); "
            "import os; print(len(os.listdir(%r)))" % (str(tmp_path), str(tmp_path)))
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "1", out.stderr
    assert not list(tmp_path.glob("*.json"))


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(dpobs.PortInUseError, match=f"port {port} is already in use"):
            dpobs.start(role="r", port=port)


def test_environment_fills_unset_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("DPOBS_ROLE", "driver")
    monkeypatch.setenv("DPOBS_RANK", "5")
    monkeypatch.setenv("DPOBS_SD_DIR", str(tmp_path))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    tel = dpobs.start()
    try:
        labels = json.loads(next(tmp_path.glob("*.json")).read_text())[0]["labels"]
        assert labels == {"job": "from-otel", "role": "driver", "rank": "5"}
        info = [k for k in scrape(tel) if k[0] == "target_info"][0][1]
        assert ("deployment_environment", "ci") in info and ("service_name", "from-otel") in info
    finally:
        tel.shutdown()
    monkeypatch.setenv("DPOBS_RANK", "five")
    with pytest.raises(ValueError, match="DPOBS_RANK"):
        dpobs.start()


def test_explicit_argument_beats_environment(monkeypatch):
    monkeypatch.setenv("DPOBS_ROLE", "driver")
    monkeypatch.setenv("DPOBS_VERIFY_TENSOR_HASH", "0")
    s = dpobs.Settings.resolve(role="trainer")
    assert s.role == "trainer" and s.verify_tensor_hash is False
    with pytest.raises(TypeError, match="unknown dpobs setting"):
        dpobs.start(rol="typo")


def test_two_telemetry_objects_share_nothing():
    a, b = dpobs.start(role="a"), dpobs.start(role="b")
    try:
        ca = a.instrument(dpobs.InMemoryDataPlane())
        ca.put_samples(["x"], "p", TensorDict({"v": torch.ones(1, 4)}, batch_size=[1]))
        assert value(scrape(a), "dpobs_client_operation_duration_seconds_count", op="put") == 1
        assert value(scrape(b), "dpobs_client_operation_duration_seconds_count", op="put") == 0
        assert a.endpoint != b.endpoint
    finally:
        a.shutdown()
        b.shutdown()


def test_step_codec_and_step_metrics(tel, client):
    td = TensorDict({"v": torch.ones(4, 1000)}, batch_size=[4])
    with tel.step():
        with tel.codec("pack"):
            time.sleep(0.01)
        client.put_samples(list("abcd"), "p", td)
        client.get_samples(list("ab"), "p")
        time.sleep(0.02)
    m = tel.step_metrics()
    assert m["dpobs/steps"] == 1
    assert m["dpobs/data_plane_s"] == pytest.approx(
        m["dpobs/op/put/seconds"] + m["dpobs/op/get/seconds"])
    assert 0 < m["dpobs/frac_of_step"] < 1
    assert m["dpobs/frac_of_step"] == pytest.approx(m["dpobs/data_plane_s"] / m["dpobs/step_s"])
    assert m["dpobs/op/put/mb"] == pytest.approx(16000 / 1e6)
    assert m["dpobs/op/get/mb"] == pytest.approx(8000 / 1e6)
    assert m["dpobs/op/put/share"] + m["dpobs/op/get/share"] == pytest.approx(1)
    assert m["dpobs/codec/pack_s"] >= 0.01
    assert m["dpobs/outstanding_mb"] == pytest.approx(16000 / 1e6)
    assert m["dpobs/op/get/max_latency_s"] > 0
    # The next step's deltas start from zero; the maximum is scoped to the step.
    with tel.step():
        pass
    m2 = tel.step_metrics()
    assert m2["dpobs/op/put/calls"] == 0 and m2["dpobs/op/get/max_latency_s"] == 0
    assert set(m) <= set(m2)  # stable keys
    s = scrape(tel)
    assert value(s, "dpobs_codec_duration_seconds_count", stage="pack") == 1
    with pytest.raises(ValueError, match="codec stage"):
        with tel.codec("zip"):
            pass


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")

    def make(name, *extra):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"),
                        *extra], check=True, capture_output=True)
        return str(d / f"{name}.crt"), str(d / f"{name}.key")
    return {"server": make("server"), "client": make("client")}


def test_tls_endpoint(certs):
    crt, key = certs["server"]
    tel = dpobs.start(role="tls", tls_certfile=crt, tls_keyfile=key)
    try:
        ctx = ssl.create_default_context(cafile=crt)
        body = urllib.request.urlopen(tel.url, context=ctx, timeout=10).read().decode()
        assert tel.url.startswith("https://") and "target_info" in body
        with pytest.raises(Exception):
            urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=5).read()
    finally:
        tel.shutdown()


def test_mutual_tls_requires_a_client_certificate(certs):
    crt, key = certs["server"]
    ccrt, ckey = certs["client"]
    tel = dpobs.start(role="mtls", tls_certfile=crt, tls_keyfile=key, tls_client_cafile=ccrt)
    try:
        ctx = ssl.create_default_context(cafile=crt)
        with pytest.raises((ssl.SSLError, OSError)):
            urllib.request.urlopen(tel.url, context=ctx, timeout=10).read()
        ctx.load_cert_chain(ccrt, ckey)
        assert b"target_info" in urllib.request.urlopen(tel.url, context=ctx, timeout=10).read()
    finally:
        tel.shutdown()
