"""`dpobs demo --weight-sync gloo|mooncake`: the model and its faults in one process; then the
real processes over each transport: every sync's bytes and tensors exactly as the workload
counted them, every tensor checked and none mismatched on clean syncs, the refit in the
Perfetto trace and the PNG;
and a flipped weight and a rollout that stopped loading delivered to Alertmanager as
DpobsWeightsMismatch and DpobsWeightsStale through the demo's own Prometheus."""
from __future__ import annotations

import argparse
import importlib.util
import io
import json

import pytest
import torch

from dpobs_otel import names as nm
from dpobs_otel.demo import command as demo_command
from dpobs_otel.demo import report as demo
from dpobs_otel.demo import weightsync as ws
from dpobs_otel.demo.batches import Config
from dpobs_otel.demo.weightsync_report import metrics_of, stack_mixin, truth_of
from dpobs_otel.testing.stack import Stack, binaries
from dpobs_otel.tracing import command

STEPS = 3
MODEL_BYTES = 62_928_384  # 31,464,192 bf16 parameters
TENSORS = 39
CFG = Config(steps=STEPS, trainers=2, batch_size=8, min_len=8, max_len=32, latency_s=0.001,
             verify=True, weight_sync="gloo")
SENDER, RECEIVER = ("trainer", 0), ("rollout", 0)


# -- in one process ------------------------------------------------------------------------
def test_the_model_is_a_small_decoders_worth_and_every_step_changes_every_tensor():
    a, b = ws.Model(0), ws.Model(0)
    assert len(a.tensors) == TENSORS and ws.nbytes(a.tensors.values()) == MODEL_BYTES
    assert {t.dtype for t in a.tensors.values()} == {torch.bfloat16}
    before = {n: t.clone() for n, t in a.tensors.items()}
    a.update(1)
    b.update(1)
    for name, t in a.tensors.items():  # the replay is the trainer's model, bit for bit
        assert ws._same(t, b.tensors[name]) and not ws._same(t, before[name]), name


def test_a_flip_changes_one_element_of_one_tensor_and_the_replay_tells_why():
    m = ws.Model(1)
    got = dict(ws._flipped((n, t.clone()) for n, t in m.tensors.items()))
    differ = [n for n in got if not torch.equal(got[n], m.tensors[n])]
    assert differ == [ws.CORRUPTED]
    assert int((got[ws.CORRUPTED] != m.tensors[ws.CORRUPTED]).sum()) == 1
    w = {"compared": 0, "differ": {}}
    extra = {"extra.weight": torch.zeros(2, dtype=torch.bfloat16)}
    del got["lm_head.weight"]
    ws._compare(w, m.tensors, got | extra)
    assert w == {"compared": TENSORS + 1,
                 "differ": {"value": 1, "missing": 1, "unexpected": 1}}


@pytest.mark.parametrize("argv, error", [
    (["--corrupt-weights-at", "2"], "need --weight-sync"),
    (["--weight-sync", "gloo", "--skip-weight-sync-at", "0"], "N >= 1"),
    (["--weight-sync", "gloo", "--async", "2"], "not with --async"),
])
def test_the_weight_flags_are_checked(argv, error):
    p = argparse.ArgumentParser()
    demo_command.add_arguments(p)
    with pytest.raises(SystemExit, match=error):
        demo.config(p.parse_args(argv))


# -- the real processes over each transport (gloo, Mooncake's TransferEngine) --------------
@pytest.fixture(scope="module", params=sorted(ws.TRANSPORTS))
def clean(request, tmp_path_factory):
    """A clean traced run over each transport, its Result, report and trace files, read
    while the processes are up."""
    if request.param == "mooncake" and importlib.util.find_spec("mooncake") is None:
        pytest.skip("the mooncake wheel is not installed (pip install "
                    "mooncake-transfer-engine-non-cuda)")
    folder = tmp_path_factory.mktemp("weights")
    cfg = Config(**{**CFG.__dict__, "trace": True, "weight_sync": request.param})
    with demo.session(cfg) as res:
        command.demo_outputs(cfg, res.info, str(folder), io.StringIO())
        yield res, demo.report(res, None, cfg), folder


def test_every_sync_moves_the_models_bytes_as_the_workload_counted_them(clean):
    res, _, _ = clean
    syncs = STEPS + 1  # the warm-up's version 0, then one per measured step
    for key, side in ((SENDER, "send"), (RECEIVER, "receive")):
        truth, got = truth_of(res.warm[key], res.truth[key]), metrics_of(res.scraped[key], side)
        assert truth["syncs"] == got["syncs"] == syncs, key
        assert truth["bytes"] == got["bytes"] == syncs * MODEL_BYTES, key
        assert truth["tensors"] == got["tensors"] == syncs * TENSORS, key
        assert truth["version"] == got["version"] == STEPS, key
    others = [k for k in res.info if k not in (SENDER, RECEIVER)]
    assert others and not any(n.startswith("dpobs_weights") for k in others
                              for n, _, _ in res.scraped[k])


def test_every_tensor_is_checked_on_clean_syncs_and_none_mismatched(clean):
    res, report, _ = clean
    truth, got = truth_of(res.warm[RECEIVER], res.truth[RECEIVER]), \
        metrics_of(res.scraped[RECEIVER], "receive")
    assert got["checked"] == truth["compared"] == (STEPS + 1) * TENSORS
    assert got["mismatched"] == dict.fromkeys(nm.WEIGHT_MISMATCH_REASONS, 0.0)
    assert truth["differ"] == {}
    # the refit is the trainer's step time, the rollout loads between its steps
    assert got["in_step"] == 0 and metrics_of(res.scraped[SENDER], "send")["in_step"] > 0
    assert f"tensors checked {(STEPS + 1) * TENSORS}, mismatched 0" in report, report


def test_the_refit_is_in_the_perfetto_trace_and_the_picture(clean):
    _, _, folder = clean
    events = json.loads((folder / "trace.json").read_text())["traceEvents"]
    syncs = [e for e in events if e.get("cat") == "weights"]
    for side in nm.WEIGHT_SIDES:  # the measured steps' versions, each side once
        mine = sorted(e["name"] for e in syncs if e["name"].startswith(f"weights {side} "))
        assert mine == sorted(f"weights {side} v{v}" for v in range(1, STEPS + 1)), syncs
    assert {(e["args"]["bytes"], e["args"]["tensors"]) for e in syncs} == {
        (MODEL_BYTES, TENSORS)}
    assert (folder / "timeline.png").read_bytes()[:4] == b"\x89PNG"


# -- the faults, through the demo's Prometheus and Alertmanager ----------------------------
@pytest.mark.skipif(None in binaries().values(), reason="prometheus/alertmanager not on PATH")
def test_a_flipped_weight_and_a_stopped_load_reach_alertmanager():
    cfg = Config(**{**CFG.__dict__, "steps": 6, "corrupt_weights_at": 2,
                    "skip_weight_sync_at": 4})
    with Stack(mixin=stack_mixin(cfg)) as stack:
        cfg.sd_dir = stack.sd_dir
        with demo.session(cfg, stack) as res:
            want = {nm.ALERT_WEIGHTS_MISMATCH, nm.ALERT_WEIGHTS_STALE}
            assert cfg.faults_alert() == want
            alerts = {}
            for a in stack.wait_alerts(want):
                alerts.setdefault(a["labels"]["alertname"], []).append(a)
            assert want <= set(alerts), stack.api("alerts")
            [bad] = alerts[nm.ALERT_WEIGHTS_MISMATCH]
            assert bad["labels"]["reason"] == "value"
            assert bad["labels"]["severity"] == "critical"
            [stale] = alerts[nm.ALERT_WEIGHTS_STALE]
            assert (stale["labels"]["role"], stale["labels"]["side"]) == ("rollout", "receive")
            [mismatched] = stack.query(f"sum({nm.WEIGHTS_MISMATCHED_SERIES})")
            assert mismatched["value"] == 1
    truth = truth_of(res.warm[RECEIVER], res.truth[RECEIVER])
    assert truth["differ"] == {"value": 1} and truth["version"] == 3  # loaded 0..3
    assert metrics_of(res.scraped[RECEIVER], "receive")["version"] == 3
    assert metrics_of(res.scraped[SENDER], "send")["version"] == 6
