"""Rings from several processes, merged on the wall clock, as Chrome trace-event JSON
(the format ui.perfetto.dev and chrome://tracing open).

Every process keeps its spans in its own wall clock (Unix nanoseconds); the merge takes them
as they are. Within a process the durations are exact (one monotonic clock); across nodes the
tracks are offset by the nodes' clock skew (NTP keeps it near a millisecond, PTP far below),
so an op on one node may appear to start before the put it waits for on another: compare
durations across nodes, and order only when the gap is well above the skew.

Events: one process track per dpobs process ("M" process_name: role, rank, node, instance),
one thread track per thread ("M" thread_name), and "X" complete events with ts and dur in
microseconds since the earliest span: steps ("step N"), ops (the op's name, args partition,
keys, bytes, error, step) and exposed waits."""
from __future__ import annotations

from dataclasses import dataclass, field

from .tracer import last_steps


@dataclass
class Process:
    name: str  # "trainer 0 · node · host:port"
    resource: dict
    threads: dict[int, str]  # tid -> thread name
    spans: list[dict] = field(default_factory=list)


def process_name(resource: dict, address: str = "") -> str:
    instance = resource.get("instance") or address
    return (f"{resource.get('role', '?')} {resource.get('rank', '?')} · "
            f"{resource.get('node', '?')} · {instance}")


def processes(collected: list[tuple[str, dict]]) -> list[Process]:
    """(address, /trace body) pairs -> Processes in a stable order (role, rank, node)."""
    out = [Process(process_name(body.get("resource", {}), address), body.get("resource", {}),
                   {int(t): n for t, n in body.get("threads", {}).items()},
                   list(body.get("spans", [])))
           for address, body in collected]
    return sorted(out, key=lambda p: (str(p.resource.get("role")),
                                      _int(p.resource.get("rank")), p.name))


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def last(procs: list[Process], steps: int) -> list[Process]:
    """Each process with only the spans of its last `steps` steps."""
    return [Process(p.name, p.resource, p.threads, last_steps(p.spans, steps)) for p in procs]


def origin_ns(procs: list[Process]) -> int:
    return min((s["start_ns"] for p in procs for s in p.spans), default=0)


def chrome_trace(procs: list[Process], missing: dict[str, str] | None = None) -> dict:
    origin = origin_ns(procs)
    events: list[dict] = []
    for pid, proc in enumerate(procs, start=1):
        track_of, names = tracks(proc)
        events += _metadata(pid, proc.name, names)
        events += sorted((_event(pid, t, s, origin) for s, t in zip(proc.spans, track_of)),
                         key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"origin_unix_ns": origin, "clock": "each process's wall clock; "
                          "tracks of different nodes are offset by their clock skew",
                          "not_answered": dict(missing or {})}}


def tracks(proc: Process) -> tuple[list[int], list[str]]:
    """(each span's track id, the tracks' names by id - 1). A thread is one track, the main
    thread first, then in order of first span; a span that overlaps another of its thread
    without nesting in it (asyncio ops gathered on one thread) goes to an extra track of
    that thread, since complete events on one track must nest."""
    spans, names = proc.spans, []
    track_of = [0] * len(spans)
    first: dict[int, int] = {}
    for s in sorted(spans, key=lambda s: s["start_ns"]):
        first.setdefault(s["tid"], s["start_ns"])
    for tid in sorted(first, key=lambda t: (proc.threads.get(t) != "MainThread", first[t])):
        name = proc.threads.get(tid, f"thread {tid}")
        lanes: list[tuple[int, list[int]]] = []  # (track id, stack of open end times)
        mine = sorted((i for i, s in enumerate(spans) if s["tid"] == tid),
                      key=lambda i: (spans[i]["start_ns"], -spans[i]["end_ns"]))
        for i in mine:
            start, end = spans[i]["start_ns"], spans[i]["end_ns"]
            for track, stack in lanes:
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or end <= stack[-1]:
                    break
            else:
                names.append(name if not lanes else f"{name} (overlapping {len(lanes)})")
                track, stack = len(names), []
                lanes.append((track, stack))
            stack.append(end)
            track_of[i] = track
    return track_of, names


def _metadata(pid: int, process: str, tracks: list[str]) -> list[dict]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": process}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
            "args": {"sort_index": pid}}]
    for i, name in enumerate(tracks, start=1):
        out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": i,
                 "args": {"name": name}},
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": i,
                 "args": {"sort_index": i}}]
    return out


def _event(pid: int, tid: int, s: dict, origin: int) -> dict:
    a = s["attributes"]
    kind = s["kind"]
    if kind == "op":
        name = a["op"]
        args = {"partition": a.get("partition"), "keys": a.get("keys", 0),
                "bytes": a.get("bytes", 0), "error": a.get("error.type")}
    elif kind == "step":
        name, args = f"step {a.get('step')}", {}
    elif kind == "weights":
        name = f"weights {a.get('side')} v{a.get('version')}"
        args = {"bytes": a.get("bytes", 0), "tensors": a.get("tensors", 0)}
    else:
        name, args = "wait (exposed)", {"wait": a.get("wait")}
    if "step" in a:
        args["step"] = a["step"]
    return {"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid,
            "ts": (s["start_ns"] - origin) / 1e3, "dur": (s["end_ns"] - s["start_ns"]) / 1e3,
            "args": args}
