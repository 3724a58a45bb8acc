"""`dpobs timeline` against real traced processes (three, each its own Python process, listed
in one file_sd directory, one more listed that does not answer): the Chrome trace-event JSON
checked against the format (metadata events naming process and thread tracks, complete
events with ts and dur in microseconds) and against the calls the processes made and timed
themselves; the PNG written."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from dpobs_otel.cli import main as dpobs_main
from dpobs_otel.exporters.filesd import FileSDTarget

STEPS, LATENCY = 3, 0.004
WORKER = r"""
import json, sys, threading, time
from time import perf_counter
import dpobs_otel as dpobs

class Slow(dpobs.InMemoryDataPlane):  # every call takes LATENCY seconds at least
    def list_sample_ids(self, pid):
        time.sleep(LATENCY)
        return super().list_sample_ids(pid)

role, rank, sd_dir, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tel = dpobs.start(role=role, rank=rank, job="tl", port=0, sd_dir=sd_dir, trace=True)
client = tel.instrument(Slow())
client.register_partition("p")
calls = []

def timed(step, thread):
    t0 = perf_counter()
    client.list_sample_ids("p")
    calls.append({"op": "list", "step": step, "thread": thread, "s": perf_counter() - t0})

for n in range(1, steps + 1):
    with tel.step():
        timed(n, "MainThread")
        side = threading.Thread(target=timed, args=(n, "prefetch"), name="prefetch")
        side.start(); side.join()  # no step of its own: it follows this one
        timed(n, "MainThread")
print(json.dumps({"endpoint": tel.endpoint, "calls": calls}), flush=True)
sys.stdin.readline()
tel.shutdown()
""".replace("LATENCY", repr(LATENCY))


@pytest.fixture
def traced(tmp_path, monkeypatch):
    sd = tmp_path / "sd"
    sd.mkdir()
    env_free = ["DPOBS_TRACE", "DPOBS_SD_DIR", "DPOBS_TLS_CERTFILE", "DPOBS_TLS_KEYFILE"]
    for var in env_free:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DPOBS_NODE", "node-x")
    procs, out = [], {}
    for role, rank in (("rollout", 0), ("trainer", 0), ("trainer", 1)):
        p = subprocess.Popen([sys.executable, "-c", WORKER, role, str(rank), str(sd),
                              str(STEPS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        procs.append(p)
    try:
        for (role, rank), p in zip((("rollout", 0), ("trainer", 0), ("trainer", 1)), procs):
            out[(role, str(rank))] = json.loads(p.stdout.readline())
        # A process listed but gone: named in the output, not fatal.
        dead = FileSDTarget(str(sd), "127.0.0.1:9", {"job": "tl", "role": "gone", "rank": 0},
                            name="dpobs-gone")
        yield sd, out
        dead.remove()
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)


def test_the_timeline_holds_every_call_with_the_callers_durations(traced, tmp_path, capsys):
    sd, truth = traced
    trace, png = tmp_path / "trace.json", tmp_path / "timeline.png"
    assert dpobs_main(["timeline", "--sd-dir", str(sd), "--out", str(trace),
                       "--png", str(png)]) == 0
    assert "127.0.0.1:9: no trace" in capsys.readouterr().err
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    _check_format(events)
    assert "127.0.0.1:9" in doc["otherData"]["not_answered"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    assert len(names) == 3
    for pid, name in names.items():
        role, rank = name.split(" · ")[0].split()
        assert name.split(" · ")[1] == "node-x"
        assert name.split(" · ")[2] == truth[(role, rank)]["endpoint"]
        mine = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        _check_content(mine, threads, pid, truth[(role, rank)]["calls"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def _check_format(events):
    for e in events:
        assert e["ph"] in ("M", "X") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert e["cat"] in ("op", "step", "wait") and isinstance(e["args"], dict)
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name",
                                 "thread_sort_index")
    json.dumps(events)  # plain JSON types throughout


def _check_content(mine, threads, pid, calls):
    steps = [e for e in mine if e["cat"] == "step"]
    assert [e["args"]["step"] for e in steps] == list(range(1, STEPS + 1))
    assert [e["name"] for e in steps] == [f"step {n}" for n in range(1, STEPS + 1)]
    ops = [e for e in mine if e["cat"] == "op" and e["name"] == "list"]
    got = Counter((e["args"]["step"], threads[(pid, e["tid"])]) for e in ops)
    assert got == Counter((c["step"], c["thread"]) for c in calls)
    for e in ops:
        assert e["args"]["partition"] == "p" and e["args"]["error"] is None
    # Each op's span is its measured interval: at least the store's latency, at most what
    # its caller timed around the call (matched per step and thread, longest to longest).
    for key in got:
        spans = sorted(e["dur"] for e in ops if (e["args"]["step"],
                                                 threads[(pid, e["tid"])]) == key)
        timed = sorted(c["s"] * 1e6 for c in calls if (c["step"], c["thread"]) == key)
        for dur, caller in zip(spans, timed):
            assert LATENCY * 1e6 <= dur <= caller + 1.0
    for e in ops:  # every op inside its step's slice
        step = steps[e["args"]["step"] - 1]
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1.0
    assert {e["name"] for e in mine if e["cat"] == "op"} == {"register", "list"}


def test_over_tls_the_rings_are_fetched_with_https(tmp_path, monkeypatch):
    import dpobs_otel as dpobs

    crt, key = str(tmp_path / "s.crt"), str(tmp_path / "s.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", crt], check=True, capture_output=True)
    sd = tmp_path / "sd"
    for var in ("DPOBS_TRACE", "DPOBS_TRACE_EVERY", "OTEL_TRACES_EXPORTER",
                "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    tel = dpobs.start(role="tls", rank=0, port=0, sd_dir=str(sd), trace=True,
                      tls_certfile=crt, tls_keyfile=key)
    try:
        with tel.step():
            tel.instrument(dpobs.InMemoryDataPlane()).register_partition("p")
        # the job's own TLS settings: its certificate, and the CA its processes' certs are from
        monkeypatch.setenv("DPOBS_TLS_CERTFILE", crt)
        monkeypatch.setenv("DPOBS_TLS_KEYFILE", key)
        monkeypatch.setenv("DPOBS_TLS_CLIENT_CAFILE", crt)
        out = tmp_path / "t.json"
        assert dpobs_main(["timeline", "--sd-dir", str(sd), "--out", str(out)]) == 0
    finally:
        tel.shutdown()
    names = [e["name"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names == ["step 1", "register"]
