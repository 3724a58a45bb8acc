"""docs/guides/frameworks/: one page per RL framework (issue 35, item 4). Every page is linked from the
index; every dpobs name a page mentions exists in the package; and every code block marked
`<!-- runs: send -->` or `<!-- runs: receive -->` runs, in a subprocess on loopback, against
the stand-ins the index documents, with dpobs's own /metrics then showing exactly the bytes
and tensors the stand-in generator produced (and, guard on, every tensor checked)."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpobs_otel import names
from dpobs_otel.config import Settings
from dpobs_otel.weights import Weights
from dpobs_otel.weights.sync import Sync

REPO = Path(__file__).resolve().parents[1]
PAGES_DIR = REPO / "docs" / "guides" / "frameworks"
INDEX = PAGES_DIR / "README.md"
PAGES = ("verl", "nemo-rl", "openrlhf", "slime", "trl")
# A runnable block: the marker line, then a ```python fence.
RUNS = re.compile(r"<!-- runs: (send|receive) -->\n```python\n(.*?)```", re.S)


def _text(page: str) -> str:
    return (PAGES_DIR / f"{page}.md").read_text()


def blocks(page: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in RUNS.finditer(_text(page))]


# -- every page exists and is linked ------------------------------------------------------
def test_every_page_exists_and_the_index_links_it():
    index = INDEX.read_text()
    on_disk = {p.stem for p in PAGES_DIR.glob("*.md")} - {"README"}
    assert on_disk == set(PAGES)
    for page in PAGES:
        assert f"]({page}.md)" in index, f"{page}.md is not linked from the index"


def test_one_verl_page_and_one_weight_sync_page():
    """Issue 56: a newcomer found two verl pages and three weight-sync pages. One each now,
    the verl page beside the other frameworks and saying how to turn it on in full."""
    guides = REPO / "docs" / "guides"
    assert sorted(p.relative_to(guides).as_posix() for p in guides.rglob("*.md")
                  if "verl" in p.stem) == ["frameworks/verl.md"]
    assert sorted(p.name for p in guides.rglob("*.md") if "weight" in p.stem) == ["weights.md"]
    turning_on = _text("verl").split("## Turning it on", 1)[1].split("\n## ", 1)[0]
    for variable in ("DPOBS_AUTO", "DPOBS_ROLE", "DPOBS_SD_DIR", "DPOBS_VERIFY_TENSOR_HASH"):
        assert variable in turning_on, variable


def test_every_page_without_an_adapter_has_a_runnable_send_block():
    for page in PAGES:
        if page != "verl":
            assert "send" in [kind for kind, _ in blocks(page)], page


# -- every dpobs name a page mentions exists ----------------------------------------------
def _series() -> set[str]:
    return {v for k, v in vars(names).items() if k.endswith("_SERIES") and isinstance(v, str)}


def _settings_vars() -> set[str]:
    from_settings = {"DPOBS_" + f.name.upper() for f in dataclasses.fields(Settings)}
    # the switches read outside Settings, as the package spells them
    source = "".join(p.read_text() for p in (REPO / "dpobs_otel").glob("*.py"))
    return from_settings | set(re.findall(r"\bDPOBS_[A-Z_]*[A-Z]\b", source))


def _alerts() -> set[str]:
    return {v for v in vars(names).values() if isinstance(v, str) and v.startswith("Dpobs")}


@pytest.mark.parametrize("page", PAGES)
def test_every_dpobs_name_on_the_page_exists(page):
    text = _text(page)
    series, env, alerts = _series(), _settings_vars(), _alerts()
    unknown = []
    for name in set(re.findall(r"\bdpobs_[a-z0-9_]+", text)):
        if name.startswith("dpobs_otel"):
            continue  # the package itself
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base not in series:
            unknown.append(name)
    unknown += [v for v in set(re.findall(r"\bDPOBS_[A-Z_]*[A-Z]\b", text)) if v not in env]
    unknown += [a for a in set(re.findall(r"\bDpobs[A-Z]\w+", text)) if a not in alerts]
    unknown += [f"tel.weights.{m}" for m in set(re.findall(r"\btel\.weights\.(\w+)", text))
                if not hasattr(Weights, m)]
    unknown += [f"sync.{m}" for m in set(re.findall(r"\bsync\.(\w+)\(", text))
                if not hasattr(Sync, m)]
    assert not unknown, f"{page}.md names what the package does not have: {sorted(unknown)}"


# -- the runnable blocks ------------------------------------------------------------------
# The stand-ins docs/guides/frameworks/README.md documents, defined afresh for every block.
STANDINS = '''
import torch
step = 7
def weights():
    g = torch.Generator().manual_seed(35)
    shapes = {"embed.weight": (64, 32), "layers.0.attn.qkv.weight": (96, 32),
              "layers.0.attn.qkv.bias": (96,), "layers.0.mlp.up.weight": (128, 32),
              "layers.0.norm.weight": (32,), "lm_head.weight": (64, 32)}
    # held until the generator ends, as named_parameters() holds a model's: dpobs counts a
    # tensor once per sync by its address, and a freed tensor's address can come back
    made = [(name, torch.randn(shape, generator=g).to(torch.bfloat16))
            for name, shape in shapes.items()]
    yield from made
wire = []
def send(name, tensor):
    wire.append((name, tensor.clone()))
def receive():
    yield from RECEIVED
loaded = []
def load_weights(pairs):
    loaded.extend(name for name, _ in pairs)
dist, group = torch.distributed, None
'''

RUNNER = r'''
import json, re, sys, tempfile, urllib.request
import torch
import torch.distributed
from dpobs_otel import names

torch.distributed.init_process_group(  # one process, a file store: no port
    "gloo", store=torch.distributed.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
jobs = json.load(sys.stdin)

def metric(text, series, side=None):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(series) and (line[len(series):len(series) + 1] in "{ ") and (
                side is None or f'side="{side}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total

wires, out = {}, []
for job in sorted(jobs, key=lambda j: j["kind"] != "send"):  # senders first
    ns = {"RECEIVED": wires.get(job["page"], [])}
    exec(job["standins"], ns)
    exec(compile(job["code"], job["page"] + ".md", "exec"), ns)
    tel, side = ns["tel"], job["kind"]
    tel.weights.settle(30)  # the check reads the sender's manifest from the store, off the sync
    text = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read().decode()
    expected = list(ns["weights"]())
    out.append({
        "page": job["page"], "kind": side, "host": tel.endpoint.rsplit(":", 1)[0],
        "bytes": metric(text, names.WEIGHTS_TRANSFERRED_SERIES, side),
        "tensors": metric(text, names.WEIGHTS_TENSORS_SERIES, side),
        "version": metric(text, names.WEIGHTS_VERSION_SERIES, side),
        "checked": metric(text, names.WEIGHTS_CHECKED_SERIES),
        "mismatched": metric(text, names.WEIGHTS_MISMATCHED_SERIES),
        "prove": bool(tel.weights.prove),
        "expected_bytes": sum(t.numel() * t.element_size() for _, t in expected),
        "expected_names": [n for n, _ in expected],
        "loaded": ns["loaded"], "step": ns["step"]})
    if side == "send":
        wires[job["page"]] = ns["wire"]
    tel.shutdown()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def ran():
    jobs = [{"page": page, "kind": kind, "code": code, "standins": STANDINS}
            for page in PAGES for kind, code in blocks(page)]
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_runnable_block_ran(ran):
    want = sorted((p, k) for p in PAGES for k, _ in blocks(p))
    assert sorted((r["page"], r["kind"]) for r in ran) == want and want


def test_each_block_counts_exactly_the_stand_in_weights(ran):
    for r in ran:
        where = f"{r['page']}.md ({r['kind']})"
        assert r["host"] == "127.0.0.1", where  # loopback only
        assert r["bytes"] == r["expected_bytes"], where
        assert r["tensors"] == len(r["expected_names"]), where
        assert r["version"] == r["step"], where


def test_each_receive_block_loads_every_weight_and_proves_it(ran):
    receives = [r for r in ran if r["kind"] == "receive"]
    assert receives
    for r in receives:
        where = f"{r['page']}.md"
        assert r["loaded"] == r["expected_names"], where  # the fingerprints' item kept out
        if r["prove"]:
            assert (r["checked"], r["mismatched"]) == (len(r["expected_names"]), 0), where
