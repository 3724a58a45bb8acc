"""The two layouts side by side on one live workload: the same processes scraped by a
`dpobs agent` into a central Prometheus with the one-tier rules, and by a node-tier server
(`dpobs agent --tier node`) into a second central with the two-tier rules. On a steady
workload their answers agree within 2% (they differ only by when each scraped; promtool
holds the rules themselves exactly equal, tests/mixin/test_node_tier.py), and the two-tier
central holds no raw bucket series."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dpobs_otel import names as n
from dpobs_otel.mixin.alerts import alerts_file
from dpobs_otel.mixin.config import DEFAULT
from dpobs_otel.mixin.node_tier import central_file
from dpobs_otel.testing.prometheus import Agent, Central, rule_files

pytestmark = pytest.mark.slow

JOB = "tier-live"
REL = 0.02
WARM_S = 10
ANSWERS = (n.JOB_FRAC_OF_STEP, n.JOB_OP_SHARE, n.JOB_OP_QUANTILE, n.JOB_OP_MEAN)
# Four processes in one interpreter, every op's duration a sleep in the middle of one bucket
# of the op histogram (so each quantile interpolates inside a bucket whose share of the
# calls is fixed), every step the same length: a get of 15 ms (60 ms for rank 2 of the
# rollouts, the straggler) and a put of 7 ms, then compute up to 90 ms a step.
WORKLOAD = """
import sys, threading, time
import torch
from tensordict import TensorDict
import dpobs_otel as dpobs

class Timed(dpobs.InMemoryDataPlane):
    def __init__(self, get_s):
        super().__init__()
        self.get_s = get_s
    def get_samples(self, *a, **k):
        time.sleep(self.get_s)
        return super().get_samples(*a, **k)
    def put_samples(self, *a, **k):
        time.sleep(0.007)
        return super().put_samples(*a, **k)

def loop(tel, store):
    client = tel.instrument(store)
    client.register_partition("p")
    step = 0
    while True:
        t0 = time.monotonic()
        ids = [f"{step}-{i}" for i in range(4)]
        with tel.step():
            client.put_samples(ids, "p", TensorDict({"x": torch.ones(4, 8)}, [4]))
            client.get_samples(ids, "p")
            time.sleep(max(0.0, 0.09 - (time.monotonic() - t0)))
        step += 1

for rank, role in enumerate(["rollout", "rollout", "rollout", "trainer"]):
    tel = dpobs.start(role=role, rank=rank, job=sys.argv[2], sd_dir=sys.argv[1])
    store = Timed(0.06 if rank == 2 else 0.015)
    threading.Thread(target=loop, args=(tel, store), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _answers(central: Central, at: float) -> dict:
    return {(record, tuple(sorted(r["metric"].items()))): r["value"]
            for record in ANSWERS for r in central.query(record, at=at)}


def test_one_tier_and_two_tier_agree_within_2_percent_live(tmp_path):
    sd = tmp_path / "sd"
    sd.mkdir()
    two_rules = []
    for name, text in (("dpobs-central.rules.yml", central_file(DEFAULT)),
                       ("dpobs-alerts.rules.yml", alerts_file(DEFAULT))):
        (tmp_path / name).write_text(text)
        two_rules.append(str(tmp_path / name))
    one = Central(rule_files(tmp_path / "one"), interval="1s")
    two = Central(two_rules, interval="1s")
    agent = Agent(str(sd), f"{one.url}/api/v1/write", "n1")
    node = Agent(str(sd), f"{two.url}/api/v1/write", "n1", extra=["--tier", "node"])
    work = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(sd), JOB],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert work.stdout.readline().strip() == "ready"
        # Past the workload's first steps (imports, first allocations) before any scrape:
        # the windows, still short here, then hold steady steps only.
        time.sleep(WARM_S)
        for p in (one, two, agent, node):
            p.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = [_answers(c, time.time()) for c in (one, two)]
            if all(len(g) >= 10 for g in got) and set(got[0]) == set(got[1]):
                break
            time.sleep(2)
        time.sleep(30)  # windows of 30 s and more: each layout's scrapes are a small part
        at = time.time() - 5  # both centrals have had each forwarder's batch by then
        a, b = _answers(one, at), _answers(two, at)
        assert set(a) == set(b) and len(a) >= 10, (sorted(a), sorted(b))
        apart = {k: abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k])) for k in a if a[k] or b[k]}
        print(f"the layouts' answers at most {100 * max(apart.values()):.2f}% apart "
              f"over {len(apart)} series")
        assert max(apart.values()) <= REL, sorted(apart.items(), key=lambda kv: -kv[1])[:3]
        straggler = two.query(f'{n.INSTANCE_OP_MEAN}{{op="get",rank="2"}}')
        assert straggler and straggler[0]["metric"]["node"] == "n1"  # sent by the node
        assert not two.query('{__name__=~"dpobs_.+_bucket"}')
        assert one.query('{__name__=~"dpobs_.+_bucket"}')
    finally:
        work.stdin.close()
        work.terminate()
        work.wait()
        for p in (node, agent, two, one):
            p.close()
