"""TransferQueue's exporter found and announced (store_metrics.py), without Ray: the shared
file_sd target that N processes write as one (real processes, real locks), the config dpobs
hands init (on only when asked, never the user's object changed), and every way discovery
can fail leaving init's result as TransferQueue made it, counted. The live half is
test_tq_store_metrics.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types

import pytest
from helpers import scrape, value
from omegaconf import OmegaConf

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.adapters.transferqueue import TransferQueueInstrumentor
from dpobs_otel.adapters.transferqueue import instrument as tq_instrument
from dpobs_otel.adapters.transferqueue import store_metrics
from dpobs_otel.adapters.transferqueue.store_metrics import ROLE, on_this_host, with_exporter
from dpobs_otel.exporters.filesd import SharedFileSDTarget, boot_id, sweep
from dpobs_otel.readback.scrape import targets

pytestmark = pytest.mark.skipif(boot_id() is None, reason="needs Linux's boot id and /proc")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
ERRORS = "dpobs_instrumentation_errors_total"
ENDPOINT = "127.0.0.1:9"  # the controller's, as TransferQueue writes it
LABELS = {"job": "j", "role": ROLE}

# A child that announces the shared target, says where, and waits to be killed.
CHILD = """
import sys, time
from dpobs_otel.exporters.filesd import SharedFileSDTarget
t = SharedFileSDTarget(sys.argv[1], "127.0.0.1:9", {"job": "j", "role": "tq-controller"}, "c")
print(t.path, flush=True)
time.sleep(600)
"""


def _announcers(sd_dir, n: int) -> tuple[list, set]:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(sd_dir)], stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]
    return procs, {p.stdout.readline().strip() for p in procs}


def _kill(procs) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


def _json_files(sd_dir) -> list[str]:
    return sorted(e for e in os.listdir(sd_dir) if e.endswith(".json"))


# -- the shared target ------------------------------------------------------------------------
def test_n_processes_announcing_one_target_make_one_file(tmp_path):
    procs, paths = _announcers(tmp_path, 4)
    try:
        mine = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")
        assert paths == {mine.path} and _json_files(tmp_path) == [os.path.basename(mine.path)]
        assert os.path.basename(mine.path) == f"c@{boot_id()}.0.json"
        # the format of every process's file: one group, the target, the labels
        with open(mine.path) as f:
            assert json.load(f) == [{"targets": [ENDPOINT], "labels": LABELS}]
        (t,) = targets(str(tmp_path), stores=True)
        assert (t.address, dict(t.labels), t.alive) == (ENDPOINT, LABELS, True)
        _kill(procs[:2])
        assert sweep(str(tmp_path)) == [] and os.path.exists(mine.path)  # others still hold it
        mine.remove()
        assert os.path.exists(mine.path)  # not the last announcer
    finally:
        _kill(procs[2:])
    assert sweep(str(tmp_path)) == [mine.path]  # the last ones went by SIGKILL: swept


def test_the_last_announcer_removes_it_and_force_removes_it_for_all(tmp_path):
    a = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")
    b = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")
    b.remove()
    assert os.path.exists(a.path)
    a.remove()
    assert _json_files(tmp_path) == []
    procs, _ = _announcers(tmp_path, 1)
    try:
        c = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")
        c.remove(force=True)  # the controller is gone: whoever else announces it
        assert _json_files(tmp_path) == []
        d = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")  # a new one, whole
        assert json.load(open(d.path)) == [{"targets": [ENDPOINT], "labels": LABELS}]
        d.remove()
    finally:
        _kill(procs)


def test_a_forked_child_leaves_its_parents_announcement(tmp_path):
    t = SharedFileSDTarget(str(tmp_path), ENDPOINT, LABELS, "c")
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the descriptor, and only that
        t.remove()
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.path.exists(t.path) and sweep(str(tmp_path)) == []
    t.remove()
    assert not os.path.exists(t.path)


# -- what init is handed ------------------------------------------------------------------------
@pytest.mark.parametrize("conf, want", [
    (None, {"metrics": {"enabled": True}}),
    ({"backend": {"x": 1}}, {"backend": {"x": 1}, "metrics": {"enabled": True}}),
    ({"metrics": {"port": 0}}, {"metrics": {"port": 0, "enabled": True}}),
    ({"metrics": {"enabled": None}}, {"metrics": {"enabled": True}}),
])
def test_the_exporter_is_turned_on_in_a_copy(conf, want):
    before = json.dumps(conf)
    out = with_exporter(conf)
    assert out == want and out is not conf and json.dumps(conf) == before


@pytest.mark.parametrize("enabled", [True, False])
def test_the_users_own_setting_is_kept(enabled):
    for conf in ({"metrics": {"enabled": enabled}},
                 OmegaConf.create({"metrics": {"enabled": enabled, "port": 0}})):
        assert with_exporter(conf) is conf


def test_an_omegaconf_config_is_merged_not_changed():
    conf = OmegaConf.create({"backend": {"x": 1}})
    out = with_exporter(conf)
    assert OmegaConf.to_container(out) == {"backend": {"x": 1}, "metrics": {"enabled": True}}
    assert OmegaConf.to_container(conf) == {"backend": {"x": 1}}


def test_only_this_hosts_addresses_count_as_the_controllers_host():
    assert on_this_host("127.0.0.1")
    assert not on_this_host("192.0.2.254")  # TEST-NET-1: nobody's address
    assert not on_this_host("controller.example") and not on_this_host("")


# -- init, close and discovery through the adapter, on a stand-in module ---------------------
class FakeTQ(types.SimpleNamespace):
    """What store_metrics touches of transfer_queue: init (creating the controller, or
    joining one: then it hands back the config it got), get_metrics_endpoint, close."""

    def __init__(self, creates=True, endpoint=ENDPOINT, lookup_fails=False, init_fails=False):
        super().__init__(sent=[], closed=0, looked_up=0)
        self._creates, self._lookup_fails, self._init_fails = creates, lookup_fails, init_fails
        self._endpoint = None if creates else endpoint  # a joiner finds the exporter on
        self._would_be = endpoint

    def init(self, conf=None):
        self.sent.append(conf)
        if self._init_fails:
            raise RuntimeError("no Ray")
        if not self._creates:
            return conf
        if conf and conf.get("metrics", {}).get("enabled"):
            self._endpoint = self._would_be
        return OmegaConf.create({"metrics": {"endpoint": self._endpoint}})

    def get_metrics_endpoint(self):
        self.looked_up += 1
        if self._lookup_fails:
            raise ConnectionError("controller gone")
        return self._endpoint

    def close(self):
        self.closed += 1


@pytest.fixture
def start_tel(monkeypatch, tmp_path):
    for var in ("DPOBS_TQ_METRICS", "DPOBS_SD_DIR", "DPOBS_JOB", "DPOBS_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    made = []

    def start(tq_metrics=True, sd_dir=True):
        monkeypatch.setenv("DPOBS_TQ_METRICS", "1" if tq_metrics else "0")
        t = dpobs.start(role="test", rank=0, port=0, job="j",
                        sd_dir=str(tmp_path) if sd_dir else None)
        made.append(t)
        return t

    yield start
    for t in made[:1]:  # whatever a test left announced in this process
        store_metrics.release(t, force=True)
    for t in made:
        t.shutdown()


def _controller_files(sd_dir) -> list[str]:
    return [e for e in _json_files(sd_dir) if e.startswith("tq-controller-")]


def test_asked_the_creator_turns_the_exporter_on_and_announces_it_once(start_tel, tmp_path):
    fake = FakeTQ()
    tq = tq_instrument(start_tel(), fake)
    user = {"backend": {"x": 1}}
    out = tq.init(user)
    tq.init(user)  # a second init in the process: still one announcement
    assert fake.sent[0] == {**user, "metrics": {"enabled": True}} and user == {"backend": {"x": 1}}
    assert out.metrics.endpoint == ENDPOINT and fake.looked_up == 0  # init returned it
    (name,) = _controller_files(tmp_path)
    assert name == f"tq-controller-j-127.0.0.1_9@{boot_id()}.0.json"
    with open(tmp_path / name) as f:
        assert json.load(f) == [{"targets": [ENDPOINT], "labels": {"job": "j", "role": ROLE}}]
    tq.close()
    assert fake.closed == 1 and _controller_files(tmp_path) == []


def test_not_asked_the_config_goes_through_untouched(start_tel, tmp_path):
    fake = FakeTQ()
    user = {"backend": {"x": 1}}
    tq_instrument(start_tel(tq_metrics=False), fake).init(user)
    assert fake.sent == [user] and fake.sent[0] is user
    assert fake.looked_up == 1 and _controller_files(tmp_path) == []  # looked: it was off


def test_a_joining_process_finds_it_on_and_gets_its_own_config_back(start_tel, tmp_path):
    fake = FakeTQ(creates=False)
    assert tq_instrument(start_tel(), fake).init() is None  # not dpobs's copy
    assert fake.looked_up == 1 and len(_controller_files(tmp_path)) == 1


def test_a_controller_on_another_host_is_left_to_that_hosts_processes(start_tel, tmp_path):
    tq_instrument(start_tel(), FakeTQ(endpoint="192.0.2.254:9")).init()
    assert _controller_files(tmp_path) == []


def test_without_an_sd_dir_or_an_exporter_nothing_is_looked_up(start_tel):
    fake = FakeTQ(creates=False)
    tq_instrument(start_tel(sd_dir=False), fake).init()
    assert fake.looked_up == 0
    sent = []  # 0.1.6: no exporter, so no metrics key in its config
    old = types.SimpleNamespace(init=sent.append)
    tq_instrument(start_tel(), old).init()
    assert sent == [None]


def test_discovery_that_fails_is_counted_and_init_returns_what_tq_returned(start_tel, tmp_path,
                                                                          monkeypatch):
    t = start_tel()
    fake = FakeTQ(creates=False, lookup_fails=True)
    user = {"backend": {}}
    assert tq_instrument(t, fake).init(user) is user
    monkeypatch.setattr(store_metrics, "SharedFileSDTarget", _raises(PermissionError("ro")))
    out = tq_instrument(t, FakeTQ()).init()
    assert out.metrics.endpoint == ENDPOINT and _controller_files(tmp_path) == []
    assert value(scrape(t), ERRORS, component=names.COMPONENT_FILE_SD) == 2


def test_a_config_dpobs_cannot_read_goes_as_it_is_counted(start_tel):
    t = start_tel()
    fake = FakeTQ(creates=False)
    odd = {"metrics": 5}  # TransferQueue's business to refuse, not dpobs's
    assert tq_instrument(t, fake).init(odd) is odd and fake.sent[0] is odd
    assert value(scrape(t), ERRORS, component=names.COMPONENT_ADAPTER) == 1


def test_transfer_queues_own_failure_reaches_the_caller_unchanged(start_tel, tmp_path):
    with pytest.raises(RuntimeError, match="no Ray"):
        tq_instrument(start_tel(), FakeTQ(init_fails=True)).init()
    assert _controller_files(tmp_path) == []


def _raises(exc):
    def fn(*args, **kwargs):
        raise exc
    return fn


# -- the off switch ------------------------------------------------------------------------
@pytest.mark.parametrize("switch", [("DPOBS_DISABLED", "1"), ("OTEL_SDK_DISABLED", "true")])
def test_switched_off_init_and_close_are_transfer_queues_own(monkeypatch, tmp_path, switch):
    import transfer_queue

    monkeypatch.setenv(*switch)
    monkeypatch.setenv("DPOBS_TQ_METRICS", "1")
    monkeypatch.setenv("DPOBS_SD_DIR", str(tmp_path))
    fake = FakeTQ()
    assert tq_instrument(dpobs.start(), fake) is fake
    own = transfer_queue.init, transfer_queue.close
    inst = TransferQueueInstrumentor()
    inst.instrument()
    try:
        assert (transfer_queue.init, transfer_queue.close) == own
    finally:
        inst.uninstrument()
    assert os.listdir(tmp_path) == []


def test_the_instrumentor_patches_init_and_close_and_puts_them_back(monkeypatch):
    import transfer_queue

    monkeypatch.delenv("DPOBS_DISABLED", raising=False)
    own = transfer_queue.init, transfer_queue.close
    inst = TransferQueueInstrumentor()
    inst.instrument()
    try:
        assert (transfer_queue.init.__wrapped__, transfer_queue.close.__wrapped__) == own
    finally:
        inst.uninstrument()
    assert (transfer_queue.init, transfer_queue.close) == own


# -- the request table, as code and as documentation ------------------------------------------
def test_the_documented_table_is_the_code():
    from dpobs_otel.adapters.transferqueue.requests import CALLS, TABLE, markdown

    doc = open(os.path.join(REPO, "docs", "guides", "transferqueue.md")).read()
    block = doc.split("<!-- requests-table")[1].split("<!-- /requests-table -->")[0]
    assert block.split("\n", 1)[1].strip() == markdown()
    assert list(CALLS) == list(TABLE)


def test_each_release_reads_its_own_row():
    from dpobs_otel.adapters.transferqueue.exporter import CLEAR_DATA, MARK_CLEARING
    from dpobs_otel.adapters.transferqueue.requests import expected, per_op, requests

    assert MARK_CLEARING not in requests("kv.clear", (0, 1, 9)).controller
    assert MARK_CLEARING in requests("kv.clear", (0, 1, 10)).controller
    with pytest.raises(LookupError):
        requests("kv.put", (0, 1, 6))  # no exporter to compare with
    with pytest.raises(LookupError):
        requests("kv.get:short", (0, 1, 8))  # such a read is kv.get:absent there
    assert set(per_op("kv", (0, 1, 7))) == {"put", "get", "list", "clear", "register"}
    assert set(per_op("client", (0, 1, 11))) == {"claim_meta", "put", "get_data", "clear"}
    controller, storage = expected({"kv.clear": 2}, (0, 1, 11), units=3)
    assert controller[MARK_CLEARING] == 2 and storage == {CLEAR_DATA: 6}
