import json
import os
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest
import torch
from helpers import scrape, value
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
    monkeypatch.setenv("DPOBS_RANK", "five")  # said in one line (tests/test_settings.py)
    assert dpobs.Settings.resolve().rank == 0


def test_explicit_argument_beats_environment(monkeypatch):
    monkeypatch.setenv("DPOBS_ROLE", "driver")
    monkeypatch.setenv("DPOBS_VERIFY_TENSOR_HASH", "0")
    s = dpobs.Settings.resolve(role="trainer")
    assert s.role == "trainer" and s.verify_tensor_hash is False
    with pytest.raises(TypeError, match="unexpected keyword argument 'rol'"):
        dpobs.start(rol="typo")


def test_two_telemetry_objects_share_nothing():
    a, b = dpobs.start(role="a"), dpobs.start(role="b")
    try:
        ca = a.instrument(dpobs.InMemoryDataPlane())
        ca.put_samples(["x"], "p", TensorDict({"v": torch.ones(1, 4)}, batch_size=[1]))
        assert value(scrape(a), "dpobs_client_operation_duration_seconds_count", op="put") == 1
        assert value(scrape(b), "dpobs_client_operation_duration_seconds_count", op="put") is None
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
    # A synchronous loop whose ops all run inside the step: the three numbers agree.
    assert m["dpobs/busy_s"] == pytest.approx(m["dpobs/data_plane_s"], rel=1e-9)
    assert m["dpobs/exposed_s"] == pytest.approx(m["dpobs/data_plane_s"], rel=1e-9)
    assert m["dpobs/busy_frac"] == m["dpobs/exposed_frac"] == pytest.approx(
        m["dpobs/frac_of_step"])
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
    # A window with no step: only the documented key (frac_of_step) goes; the rest stay.
    client.get_samples(list("ab"), "p")
    m3 = tel.step_metrics()
    assert set(m) - set(m3) == {"dpobs/frac_of_step", "dpobs/busy_frac", "dpobs/exposed_frac"}
    assert m3["dpobs/busy_s"] == 0 and m3["dpobs/exposed_s"] == 0  # no step was open
    assert m3["dpobs/steps"] == 0 and m3["dpobs/op/get/calls"] == 1
    assert not any(k.startswith("dpobs/guard/") for k in m3)  # the guard is off
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


def test_start_lists_every_setting_and_hides_none():
    import dataclasses
    import inspect
    params = inspect.signature(dpobs.start).parameters
    assert all(p.kind is not p.VAR_KEYWORD for p in params.values())
    assert {f.name for f in dataclasses.fields(dpobs.Settings)} <= set(params)


@pytest.mark.parametrize("bad", [{"port": "9000"}, {"rank": -1}, {"rank": True}, {"role": ""},
                                 {"verify_tensor_hash": "yes"}, {"reconcile_rows": 0},
                                 {"port": 99999}, {"tls_certfile": "/c.pem"}])
def test_a_wrong_argument_in_code_is_a_one_line_value_error(bad, monkeypatch):
    monkeypatch.delenv("DPOBS_RANK", raising=False)
    with pytest.raises(ValueError) as caught:
        dpobs.start(**bad)
    line = str(caught.value)
    assert "\n" not in line and next(iter(bad)) in line


@pytest.mark.parametrize("env,rank", [({"RANK": "3"}, 3), ({"SLURM_PROCID": "5"}, 5),
                                      ({"RANK": "3", "SLURM_PROCID": "5"}, 3),
                                      ({"DPOBS_RANK": "7", "RANK": "3"}, 7)])
def test_rank_falls_back_to_torchrun_then_slurm(env, rank, monkeypatch):
    for var in ("DPOBS_RANK", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert dpobs.Settings.resolve().rank == rank


@pytest.mark.parametrize("var", ["OTEL_SDK_DISABLED", "DPOBS_DISABLED"])
def test_off_switch_hands_back_the_inner_client(var, monkeypatch):
    monkeypatch.setenv(var, "true")
    tel = dpobs.start(role="off", sd_dir="/nonexistent/never/written")
    inner = dpobs.InMemoryDataPlane()
    assert tel.instrument(inner) is inner
    assert tel.endpoint is None
    with tel.step():
        inner.put_samples(["a"], "p", TensorDict({"x": torch.ones(1)}, batch_size=[1]))
    assert tel.step_metrics() == {} and tel.cluster_step_metrics("/tmp") == {}
    tel.shutdown()
    monkeypatch.setenv(var, "maybe")  # a malformed off switch is said and counts as off
    assert dpobs.start().enabled is False


def test_public_names_are_listed_for_tools():
    assert {"start", "Telemetry", "InMemoryDataPlane", "Settings"} <= set(dir(dpobs))


def test_a_push_exporter_plugs_into_the_seam():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    class Memory:
        endpoint = None

        def __init__(self):
            self.reader = InMemoryMetricReader()
            self.closed = False

        def shutdown(self):
            self.closed = True
    exp = Memory()
    tel = dpobs.start(role="push", exporters=[exp])
    c = tel.instrument(dpobs.InMemoryDataPlane())
    c.put_samples(["a", "b"], "p", TensorDict({"x": torch.ones(2, 4)}, batch_size=[2]))
    data = exp.reader.get_metrics_data()
    seen = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}
    assert tel.endpoint is None
    [point] = seen["dpobs.client.transferred"].data.data_points
    assert point.value == 32 and dict(point.attributes) == {"op": "put", "direction": "write"}
    tel.shutdown()
    assert exp.closed


def test_guard_counts_reach_the_step_dict(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="g", verify_tensor_hash=True)
    store = dpobs.InMemoryDataPlane()
    c = tel.instrument(store)
    ids = ["a", "b", "c"]
    c.put_samples(ids, "p", TensorDict({"x": torch.arange(12.).reshape(3, 4)}, batch_size=[3]))
    c.get_samples(ids, "p")
    m = tel.step_metrics()
    assert m["dpobs/guard/rows_recorded"] == 3 and m["dpobs/guard/rows_checked"] == 3
    assert m["dpobs/guard/rows_mismatched"] == 0
    # Corrupt one stored row behind the client's back: the next step's dict shows it.
    bad = store.get_samples(["b"], "p", ["x"])
    store.put_samples(["b"], "p", TensorDict({"x": bad["x"] + 1}, batch_size=[1]))
    c.get_samples(ids, "p", ["x"])
    m = tel.step_metrics()
    assert m["dpobs/guard/rows_mismatched"] == 1 and m["dpobs/guard/rows_checked"] == 3
    assert m["dpobs/guard/rows_recorded"] == 0 and m["dpobs/guard/failures"] == 0
    tel.shutdown()


def test_every_shipped_store_implements_the_protocol():
    from dpobs_otel.protocol import DataPlane, ShortReads
    assert isinstance(dpobs.InMemoryDataPlane(), DataPlane)
    assert not isinstance(dpobs.InMemoryDataPlane(), ShortReads)  # it raises instead
