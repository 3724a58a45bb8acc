"""Scale (issue 12 item 7): 64, 128 and 256 dpobs endpoints behind 4 `dpobs agent`s into one
central Prometheus running the mixin's rules, all real binaries on loopback.

Endpoints live 16 to an OS process (one Telemetry each, own registry, own /metrics port,
own op loop thread: one step every --step-s with put, get, get(select), list, clear on an
in-memory store), so 256 fit in a few GB. Host processes are assigned round robin to the
agents' file_sd directories. Arms grow in place, 64 -> 128 -> 256: each adds host
processes, settles, then measures over a window. They run ascending, not interleaved, on
purpose: a 5m rate() window and the agents' WAL remember every series of a bigger arm for
minutes, so a smaller arm measured after a bigger one would measure the bigger one.

Per arm it prints: series per endpoint (scrape_samples_scraped), scrape duration (mean and
max over the window), agent CPU (the four prometheus processes' utime+stime over the
window) as % of wall per 32 targets, measured and scaled to a 15 s interval (measured *
interval/15: the scrape work scales with scrapes per second, but an agent's fixed work does
not, so the scaled figure is a lower bound; --interval 15s measures it), agent RSS per target,
samples/s appended by the central TSDB, and rule evaluation seconds per cycle (sum of the
groups' last durations, sampled every cycle); then each figure's growth 64 -> 256.

    unshare --net sh -c 'ip link set lo up; .venv/bin/python benchmarks/scale.py'
        [--sizes 64,128,256] [--interval 5s] [--settle 15] [--window 40] [--native-only]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dpobs_otel.readback.prometheus import PrometheusError
from dpobs_otel.testing.prometheus import Agent, Central, rule_files

JOB = "dpobs-scale"
PER_HOST = 16  # endpoints per host process unless --per-host says otherwise
AGENTS = 4


# -- the endpoint host (this file run with --host) --------------------------------------------
def host(sd_dir: str, count: int, step_s: float, first_rank: int) -> None:
    import torch
    from tensordict import TensorDict

    import dpobs_otel as dpobs
    batch = TensorDict({"obs": torch.ones(8, 64)}, batch_size=[8])

    def loop(tel, client, phase: float):
        client.register_partition("p")
        time.sleep(phase)  # spread the endpoints' steps over the period
        step = 0
        while True:
            t0 = time.monotonic()
            ids = [f"{step}-{i}" for i in range(8)]
            with tel.step():
                client.put_samples(ids, "p", batch)
                client.get_samples(ids, "p")
                client.get_samples(ids, "p", select_fields=["obs"])
                client.list_sample_ids("p")
                client.clear_samples(ids, "p")
            step += 1
            time.sleep(max(0.0, step_s - (time.monotonic() - t0)))

    for i in range(count):
        tel = dpobs.start(role="rollout", rank=first_rank + i, job=JOB, sd_dir=sd_dir)
        client = tel.instrument(dpobs.InMemoryDataPlane())
        threading.Thread(target=loop, args=(tel, client, step_s * i / count),
                         daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin


# -- measurements -----------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child_pid(agent: Agent) -> int:
    """The prometheus binary under a `dpobs agent` wrapper."""
    pid = agent.proc.pid
    deadline = time.monotonic() + 30
    while True:
        for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            # not the `prometheus --version` it runs first
            if b"--config.file" in Path(f"/proc/{kid}/cmdline").read_bytes():
                return int(kid)
        if time.monotonic() > deadline:
            raise RuntimeError(f"dpobs agent started no prometheus:\n{agent.log()}")
        time.sleep(0.1)


def central_metric(central: Central, name: str) -> float:
    """Sum of one metric's samples on the central Prometheus's own /metrics."""
    text = central.client.text(f"{central.url}/metrics", timeout=10) or ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def scalar(central: Central, expr: str) -> float:
    got = central.query(expr)
    return got[0]["value"] if got else float("nan")


def measure(central: Central, agents: list[int], n: int, window: float, interval: float,
            hosts: list[int]) -> dict:
    cpu0 = sum(map(cpu_seconds, agents))
    central_cpu0 = cpu_seconds(central.proc.pid)
    appended0 = central_metric(central, "prometheus_tsdb_head_samples_appended_total")
    t0 = time.monotonic()
    evals, groups = [], []
    while time.monotonic() - t0 < window:
        evals.append(central_metric(central, "prometheus_rule_group_last_duration_seconds"))
        groups.append(central.rules())
        time.sleep(interval)
    wall = time.monotonic() - t0
    cpu = sum(map(cpu_seconds, agents)) - cpu0
    central_cpu = cpu_seconds(central.proc.pid) - central_cpu0
    appended = central_metric(central, "prometheus_tsdb_head_samples_appended_total") - appended0
    w = f"[{int(window)}s]"
    sel = f'{{job="{JOB}"}}'
    scrape = f"scrape_duration_seconds{sel}"
    return {
        "costliest": costliest_rules(groups),
        "targets": scalar(central, f"count(up{sel} == 1)"),
        "series_per_endpoint": scalar(central, f"avg(scrape_samples_scraped{sel})"),
        "scrape_mean_ms": 1e3 * scalar(central, f"avg(avg_over_time({scrape}{w}))"),
        "scrape_max_ms": 1e3 * scalar(central, f"max(max_over_time({scrape}{w}))"),
        "agent_cpu_pct_per_32": 100 * cpu / wall / n * 32,
        "agent_rss_mib_per_agent": sum(map(rss_bytes, agents)) / len(agents) / 2**20,
        "agent_rss_kib_per_target": sum(map(rss_bytes, agents)) / n / 1024,
        "central_cpu_pct": 100 * central_cpu / wall,
        "central_rss_mib": rss_bytes(central.proc.pid) / 2**20,
        "host_rss_mib": statistics.mean(map(rss_bytes, hosts)) / 2**20,
        "samples_per_s": appended / wall,
        "central_series": central_metric(central, "prometheus_tsdb_head_series"),
        "rule_eval_s_mean": statistics.mean(evals),
        "rule_eval_s_max": max(evals),
        "rule_eval_s_per_cycle": statistics.mean(per_cycle(g, interval) for g in groups),
        "rule_eval_s_longest_group": statistics.mean(
            max(x["evaluationTime"] for x in g) for g in groups),
        "window_samples_per_series": scalar(central, f"avg(count_over_time(up{sel}[5m]))"),
    }


def query_cost(central: Central, expr: str, reps: int = 3) -> tuple[float, int, int]:
    """(median seconds, samples touched, result series) of an instant query (the query
    API's stats; samples touched do not depend on how busy the box is, seconds do)."""
    runs = []
    for _ in range(reps):
        data = central.api("query", query=expr, stats="all")
        runs.append((data["stats"]["timings"]["evalTotalTime"],
                     data["stats"]["samples"]["totalQueryableSamples"], len(data["result"])))
    return statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]


def quantile_costs(central: Central) -> dict:
    """What the latency quantile rules cost as written (each aggregates every bucket series
    itself), beside that aggregation alone. Recorded once, the aggregation would be read by
    each quantile rule as one sample per recorded series."""
    rules = [r for g in central.rules() for r in g["rules"]
             if r.get("name", "").endswith(":quantile_rate5m")]
    written = [query_cost(central, r["query"]) for r in rules]
    agg_s, agg_samples, agg_series = query_cost(
        central, "sum by (job, op, le) (rate(dpobs_client_operation_duration_seconds_bucket[5m]))")
    return {"rules": len(rules), "as_written_s": sum(w[0] for w in written),
            "as_written_samples": sum(w[1] for w in written), "aggregation_s": agg_s,
            "aggregation_samples": agg_samples,
            "recorded_once_samples": agg_samples + len(rules) * agg_series}


def per_cycle(groups: list[dict], interval: float) -> float:
    """Rule evaluation seconds per `interval`: each group's last duration weighted by how
    often it runs in one (a group on a longer interval than the cycle runs less than once)."""
    return sum(g["evaluationTime"] * interval / g["interval"] for g in groups)


def costliest_rules(samples: list[list[dict]], top: int = 8) -> list[tuple[float, str, str]]:
    """(mean seconds per evaluation over the window's samples of the rules API, rule, its
    group's interval) of the rules that took longest."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for groups in samples:
        for g in groups:
            for r in g["rules"]:
                q = r.get("labels", {}).get("quantile")
                key = (r.get("name", "?") + (f" q={q}" if q else ""), f"{g['interval']:g}s")
                seconds.setdefault(key, []).append(r["evaluationTime"])
    return sorted(((statistics.mean(v), *k) for k, v in seconds.items()), reverse=True)[:top]


# -- the run ------------------------------------------------------------------------------------
class Hosts:
    def __init__(self, sd_dirs: list[str], step_s: float, per_host: int = PER_HOST):
        self.sd_dirs, self.step_s, self.per_host = sd_dirs, step_s, per_host
        self.procs: list[subprocess.Popen] = []

    def grow_to(self, n: int) -> None:
        started = []
        while len(self.procs) * self.per_host < n:
            i = len(self.procs)
            argv = [sys.executable, __file__, "--host", self.sd_dirs[i % AGENTS],
                    str(self.per_host), str(self.step_s), str(i * self.per_host)]
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
            self.procs.append(p)
            started.append(p)
        for p in started:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("an endpoint host failed to start")

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
            p.terminate()
        for p in self.procs:
            p.wait()


def run(args) -> list[tuple[int, dict]]:
    tmp = Path(tempfile.mkdtemp(prefix="dpobs-scale-"))
    interval = float(args.interval.rstrip("s"))
    # --native-only: the mixin with classic_quantiles=False (the native quantiles only)
    rules = rule_files(tmp / "mixin", classic_quantiles=not args.native_only,
                       native_quantile_interval=args.native_quantile_interval)
    sd_dirs = [str(tmp / f"sd{i}") for i in range(AGENTS)]
    results = []
    with Central(rules, interval=args.interval, data_dir=str(tmp)) as central:
        agents = [Agent(d, f"{central.url}/api/v1/write", f"node-{i}", interval=args.interval)
                  for i, d in enumerate(sd_dirs)]
        hosts = Hosts(sd_dirs, args.step_s, args.per_host)
        try:
            for a in agents:
                a.start()
            pids = [child_pid(a) for a in agents]
            for n in args.sizes:
                hosts.grow_to(n)
                time.sleep(args.settle)
                dead = [a for a in agents if a.proc.poll() is not None]
                if dead:
                    raise RuntimeError("an agent exited:\n" + dead[0].log())
                r = measure(central, pids, n, args.window, interval,
                            [p.pid for p in hosts.procs])
                r["agent_cpu_pct_per_32_at_15s"] = r["agent_cpu_pct_per_32"] * interval / 15
                results.append((n, r))
                print(f"  {n:4d} endpoints: " + ", ".join(
                    f"{k}={v:.4g}" for k, v in r.items() if isinstance(v, float)), flush=True)
                if n == args.sizes[-1]:
                    try:  # after the figures: on a busy box these queries can time out
                        r["quantiles"] = quantile_costs(central)
                    except PrometheusError as e:
                        print(f"  quantile costs not measured: {e}", flush=True)
        finally:
            hosts.close()
            for a in agents:
                a.close()
    return results


ROWS = [("targets up", "targets", "{:.0f}"),
        ("series per endpoint", "series_per_endpoint", "{:.0f}"),
        ("scrape duration mean (ms)", "scrape_mean_ms", "{:.1f}"),
        ("scrape duration max (ms)", "scrape_max_ms", "{:.1f}"),
        ("agent CPU, % of wall per 32 targets (measured)", "agent_cpu_pct_per_32", "{:.2f}"),
        ("agent CPU, % of wall per 32 targets (scaled to 15 s)", "agent_cpu_pct_per_32_at_15s",
         "{:.2f}"),
        ("agent RSS per agent (MiB)", "agent_rss_mib_per_agent", "{:.0f}"),
        ("agent RSS per target (KiB)", "agent_rss_kib_per_target", "{:.0f}"),
        ("samples/s appended (central)", "samples_per_s", "{:.0f}"),
        ("central head series", "central_series", "{:.0f}"),
        ("central CPU, % of one core", "central_cpu_pct", "{:.1f}"),
        ("central RSS (MiB)", "central_rss_mib", "{:.0f}"),
        ("endpoint host RSS, mean per process (MiB)", "host_rss_mib", "{:.0f}"),
        ("rule evaluation per cycle, mean (s)", "rule_eval_s_mean", "{:.3f}"),
        ("rule evaluation per cycle, max (s)", "rule_eval_s_max", "{:.3f}"),
        ("rule evaluation per cycle, groups weighted by interval (s)", "rule_eval_s_per_cycle",
         "{:.3f}"),
        ("longest rule group per cycle (s)", "rule_eval_s_longest_group", "{:.3f}"),
        ("samples per series in a 5m window", "window_samples_per_series", "{:.0f}")]


def report(results: list[tuple[int, dict]], args) -> None:
    sizes = [n for n, _ in results]
    first, last = results[0][1], results[-1][1]
    growth_head = f"growth {sizes[0]}->{sizes[-1]}"
    head = f"| {'figure':54} | " + " | ".join(f"{n:>8}" for n in sizes) + \
        f" | {growth_head:>17} |"
    print(f"\nscrape/eval interval {args.interval}, step every {args.step_s}s per endpoint, "
          f"{AGENTS} agents, window {args.window}s after {args.settle}s settling")
    print(head)
    print("|" + "-" * 56 + "|" + "|".join("-" * 10 for _ in sizes) + "|" + "-" * 19 + "|")
    for label, k, fmt in ROWS:
        cells = " | ".join(f"{fmt.format(r[k]):>8}" for _, r in results)
        growth = last[k] / first[k] if first[k] else float("nan")
        print(f"| {label:54} | {cells} | {growth:>16.2f}x |")
    print(f"\ncostliest rules at {sizes[-1]} (mean seconds per evaluation over the window):")
    for seconds, name, every in last["costliest"]:
        print(f"  {seconds:.3f}  {name} (every {every})")
    q = last.get("quantiles")
    if q:
        print(f"the {q['rules']} latency quantile rules as written, as instant queries: "
              f"{q['as_written_s']:.3f} s, {q['as_written_samples']} samples touched; their bucket"
              f" aggregation alone: {q['aggregation_s']:.3f} s, {q['aggregation_samples']} samples;"
              f" recorded once and read by all {q['rules']}: {q['recorded_once_samples']} samples")
    worst_cpu = max(r["agent_cpu_pct_per_32_at_15s"] for _, r in results)
    scaled = "" if args.interval == "15s" else " (scaled from the interval: a lower bound)"
    print(f"\ngoal: agent CPU <= 2% of wall per 32 targets at 15 s{scaled}: "
          f"{'met' if worst_cpu <= 2 else 'NOT met'} (worst {worst_cpu:.2f}%)")
    print(f"goal: rule evaluation for {sizes[-1]} processes < 1 s per cycle: "
          f"{'met' if last['rule_eval_s_max'] < 1 else 'NOT met'} "
          f"(max {last['rule_eval_s_max']:.3f} s)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--host":
        sd, count, step_s, first = sys.argv[2:6]
        return host(sd, int(count), float(step_s), int(first))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,128,256",
                   type=lambda s: sorted(int(x) for x in s.split(",")))
    p.add_argument("--interval", default="5s", help="scrape and rule interval (default 5s)")
    p.add_argument("--step-s", type=float, default=1.0, help="seconds per step per endpoint")
    p.add_argument("--per-host", type=int, default=PER_HOST,
                   help=f"endpoints per host process (default {PER_HOST}; more fit 1024 in "
                        "less memory, each host's op threads then share one interpreter)")
    p.add_argument("--settle", type=float, default=15)
    p.add_argument("--window", type=float, default=40)
    p.add_argument("--native-only", action="store_true",
                   help="rules without the classic quantiles (Config(classic_quantiles=False))")
    p.add_argument("--native-quantile-interval", default="",
                   help="the native quantiles in a group of their own at this interval "
                        "(Config(native_quantile_interval=...))")
    args = p.parse_args()
    report(run(args), args)


if __name__ == "__main__":
    main()
