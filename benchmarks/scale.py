"""Scale (issues 12 and 57): dpobs endpoints of a Ray job's stated mix (MIX: drivers, workers,
data-plane clients, row age, weight senders and receivers) behind 4 forwarders into a
central Prometheus running the mixin's rules, in two layouts side by side over the same
endpoints: 4 `dpobs agent`s into a central with the one-tier rules, and 4 node-tier servers
(`dpobs agent --tier node`) into a second central with the two-tier rules
(mixin/node_tier.py). All real binaries on loopback; no live Ray (the Ray kinds record
through RayMeter as the adapter does).

Endpoints live --per-host to an OS process (one Telemetry each, own registry, own /metrics
port, own loop thread: one step of its kind every --step-s). Host processes are assigned
round robin to the forwarders' file_sd directories, which both layouts read. Arms grow in
place and run ascending (a 5m rate() window and a forwarder's WAL remember every series of a
bigger arm for minutes); within an arm the one-tier layout is measured, then the two-tier
one, each over --window, and then the two centrals' answers (frac_of_step, exposed
fraction, shares, quantiles, Ray's seconds per method) are compared at one instant.

Per arm and layout it prints series per endpoint, the central's samples/s, series, CPU
(% of one core, and CPU-seconds per evaluation interval: rule evaluation and ingest
together, the process's utime+stime), RSS, rule evaluation per cycle (the groups' last
durations, sampled every cycle: wall time, which waits for a CPU on a busy box), per node the
forwarder's CPU and RSS and, for the node tier, its own rule evaluation, and the load
average; then the two-tier / one-tier ratios and whether the two-tier central's CPU per
cycle at the largest arm is at most a quarter of the one-tier's.

    unshare --net sh -c 'ip link set lo up; exec env PYTHONPATH=$PWD .venv/bin/python benchmarks/scale.py'
        [--sizes 256,1024] [--per-host 64] [--step-s 4] [--interval 15s] [--settle 60]
        [--window 90] [--one-tier-only] [--classic-only] [--native-only]
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
import urllib.request
from pathlib import Path

from dpobs_otel import names as n

from dpobs_otel.readback.prometheus import PrometheusError
from dpobs_otel.testing import series_mix
from dpobs_otel.testing.prometheus import Agent, Central, rule_files

JOB = "dpobs-scale"
PER_HOST = 16  # endpoints per host process unless --per-host says otherwise
AGENTS = 4


# -- the endpoint host (this file run with --host) --------------------------------------------
# The stated mix (dpobs_otel/testing/series_mix.py, which tests/test_series_budget.py holds to
# a budget), each kind's endpoint one step of its kind every --step-s.


def host(sd_dir: str, count: int, step_s: float, first_rank: int) -> None:
    import dpobs_otel as dpobs

    def loop(tel, kind: str, ctx, phase: float):
        time.sleep(phase)  # spread the endpoints' steps over the period
        step = 0
        while True:
            t0 = time.monotonic()
            series_mix.STEP[kind](tel, ctx, step)
            step += 1
            time.sleep(max(0.0, step_s - (time.monotonic() - t0)))

    mix = series_mix.MIX
    for i in range(count):
        rank = first_rank + i
        kind, role = mix[rank % len(mix)]
        tel = dpobs.start(role=role, rank=rank, job=JOB, sd_dir=sd_dir,
                          **series_mix.SETTINGS[kind])
        threading.Thread(target=loop, args=(tel, kind, series_mix.context(tel, kind),
                                            step_s * i / count), daemon=True).start()
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
            hosts: list[int], nodes: list[Agent] = ()) -> dict:
    """One layout's figures over `window`; `agents` are the forwarders' prometheus pids (the
    agents, or the node-tier servers `nodes`, whose own rule groups are then read too)."""
    cpu0 = sum(map(cpu_seconds, agents))
    central_cpu0 = cpu_seconds(central.proc.pid)
    appended0 = central_metric(central, "prometheus_tsdb_head_samples_appended_total")
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    evals, groups, node_evals = [], [], []
    while time.monotonic() - t0 < window:
        try:  # a central too busy to answer in 10 s misses a sample, not the run
            evals.append(central_metric(central, "prometheus_rule_group_last_duration_seconds"))
            groups.append(central.rules())
            node_evals += [node_metric(a, "prometheus_rule_group_last_duration_seconds")
                           for a in nodes]
        except (PrometheusError, OSError) as e:
            print(f"  a sample of the window missed: {e}", flush=True)
        time.sleep(interval)
    if not evals or not groups:
        raise RuntimeError("the central answered no sample of the window")
    wall = time.monotonic() - t0
    cpu = sum(map(cpu_seconds, agents)) - cpu0
    central_cpu = cpu_seconds(central.proc.pid) - central_cpu0
    appended = central_metric(central, "prometheus_tsdb_head_samples_appended_total") - appended0
    w = f"[{int(window)}s]"
    sel = f'{{job="{JOB}"}}'
    scrape = f"scrape_duration_seconds{sel}"
    out = {
        "costliest": costliest_rules(groups),
        "targets": scalar(central, f"count(up{sel} == 1)"),
        "series_per_endpoint": scalar(central, f"avg(scrape_samples_scraped{sel})"),
        "scrape_mean_ms": 1e3 * scalar(central, f"avg(avg_over_time({scrape}{w}))"),
        "scrape_max_ms": 1e3 * scalar(central, f"max(max_over_time({scrape}{w}))"),
        "agent_cpu_pct_per_32": 100 * cpu / wall / n * 32,
        "agent_rss_mib_per_agent": sum(map(rss_bytes, agents)) / len(agents) / 2**20,
        "agent_rss_kib_per_target": sum(map(rss_bytes, agents)) / n / 1024,
        "node_cpu_s_per_cycle": cpu / len(agents) / wall * interval,
        "central_cpu_pct": 100 * central_cpu / wall,
        "central_cpu_s_per_cycle": central_cpu / wall * interval,
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
        "load_avg": (load0 + os.getloadavg()[0]) / 2,
        # pending or firing: Prometheus expands an alert's annotations for each, every cycle
        "alerts_active": scalar(central, "count(ALERTS) or vector(0)"),
    }
    out["node_rule_eval_s"] = statistics.mean(node_evals) if node_evals else float("nan")
    return out


def node_metric(node: Agent, name: str) -> float:
    """Sum of one metric's samples on a node-tier server's own /metrics."""
    with urllib.request.urlopen(f"http://{node.listen}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


# The answers compared between the layouts (the live side of tests/mixin/test_node_tier.py).
ANSWERS = (n.JOB_FRAC_OF_STEP, n.JOB_EXPOSED_FRAC_OF_STEP, n.JOB_OP_SHARE, n.JOB_OP_QUANTILE,
           n.JOB_OP_METHOD_SECONDS)


def answers_apart(one: Central, two: Central) -> dict[str, tuple[float, int, str]]:
    """Per record: (the largest relative difference, series compared, the farthest series)
    between the two centrals' answers read at one instant; a series missing on either side
    counts as 100% apart."""
    at, out = time.time(), {}
    for record in ANSWERS:
        a, b = ({tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")):
                 r["value"] for r in c.query(record, at=at)} for c in (one, two))
        worst, which = 0.0, ""
        for key in a.keys() | b.keys():
            x, y = a.get(key), b.get(key)
            if x is None or y is None:
                apart = 1.0
            else:
                apart = abs(x - y) / max(abs(x), abs(y)) if x or y else 0.0
            if apart >= worst:
                worst, which = apart, f"{dict(key)} {x} vs {y}"
        out[record] = (worst, len(a.keys() | b.keys()), which)
    return out


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


def two_tier_rules(out_dir: Path, **knobs) -> list[str]:
    """What the two-tier central loads: the central rules and the alerts (mixin/node_tier.py)."""
    from dpobs_otel.mixin.alerts import alerts_file
    from dpobs_otel.mixin.config import Config
    from dpobs_otel.mixin.node_tier import central_file
    c = Config(**knobs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "dpobs-central.rules.yml", out_dir / "dpobs-alerts.rules.yml"]
    paths[0].write_text(central_file(c))
    paths[1].write_text(alerts_file(c))
    return [str(p) for p in paths]


def run(args) -> list[tuple[int, dict]]:
    """Both layouts side by side over the same endpoints: 4 agents into a central with the
    one-tier rules, and 4 node-tier servers (`dpobs agent --tier node`) into a second
    central with the two-tier rules; each arm is measured for the two in turn, one-tier
    first, then the two centrals' answers are compared at one instant."""
    tmp = Path(tempfile.mkdtemp(prefix="dpobs-scale-"))
    interval = float(args.interval.rstrip("s"))
    knobs = dict(classic_quantiles=not args.native_only,
                 native_quantile_interval=args.native_quantile_interval)
    layouts = {"one-tier": rule_files(tmp / "mixin", **knobs),
               "two-tier": two_tier_rules(tmp / "two-tier", **knobs)}
    if args.one_tier_only:
        del layouts["two-tier"]
    sd_dirs = [str(tmp / f"sd{i}") for i in range(AGENTS)]
    results, centrals, forwarders = [], {}, {}
    hosts = Hosts(sd_dirs, args.step_s, args.per_host)
    try:
        for name, rules in layouts.items():
            (tmp / f"{name}-central").mkdir()
            centrals[name] = Central(rules, interval=args.interval, data_dir=str(tmp / f"{name}-central"),
                                     native=not args.classic_only)
            centrals[name].start()
            extra = ["--tier", "node"] if name == "two-tier" else []
            extra += ["--native-histograms", "never"] if args.classic_only else []
            forwarders[name] = [Agent(d, f"{centrals[name].url}/api/v1/write", f"node-{i}",
                                      interval=args.interval, extra=extra)
                                for i, d in enumerate(sd_dirs)]
            for a in forwarders[name]:
                a.start()
        pids = {name: [child_pid(a) for a in fw] for name, fw in forwarders.items()}
        for size in args.sizes:
            hosts.grow_to(size)
            time.sleep(args.settle)
            for name, fw in forwarders.items():
                dead = [a for a in fw if a.proc.poll() is not None]
                if dead:
                    raise RuntimeError(f"a {name} forwarder exited:\n" + dead[0].log())
                r = measure(centrals[name], pids[name], size, args.window, interval,
                            [p.pid for p in hosts.procs],
                            fw if name == "two-tier" else ())
                r["agent_cpu_pct_per_32_at_15s"] = r["agent_cpu_pct_per_32"] * interval / 15
                results.append((size, name, r))
                print(f"  {size:4d} endpoints, {name}: " + ", ".join(
                    f"{k}={v:.4g}" for k, v in r.items() if isinstance(v, float)), flush=True)
            if len(centrals) == 2:
                apart = answers_apart(centrals["one-tier"], centrals["two-tier"])
                results[-1][2]["answers_apart"] = apart
                for record, (worst, count, which) in apart.items():
                    print(f"  {size:4d} endpoints: {record} of the two layouts at most "
                          f"{100 * worst:.2f}% apart over {count} series (the farthest: "
                          f"{which})", flush=True)
    finally:
        hosts.close()
        for fw in forwarders.values():
            for a in fw:
                a.close()
        for c in centrals.values():
            c.close()
    return results


ROWS = [("targets up", "targets", "{:.0f}"),
        ("series per endpoint (scraped)", "series_per_endpoint", "{:.0f}"),
        ("samples/s appended (central)", "samples_per_s", "{:.0f}"),
        ("central head series", "central_series", "{:.0f}"),
        ("central CPU, % of one core", "central_cpu_pct", "{:.1f}"),
        ("central CPU-seconds per cycle (rules + ingest)", "central_cpu_s_per_cycle", "{:.3f}"),
        ("central RSS (MiB)", "central_rss_mib", "{:.0f}"),
        ("central rule evaluation per cycle, mean (s, wall)", "rule_eval_s_mean", "{:.3f}"),
        ("central rule evaluation per cycle, max (s, wall)", "rule_eval_s_max", "{:.3f}"),
        ("central rule evaluation, groups weighted by interval (s)", "rule_eval_s_per_cycle",
         "{:.3f}"),
        ("longest central rule group per cycle (s)", "rule_eval_s_longest_group", "{:.3f}"),
        ("per node: forwarder CPU-seconds per cycle", "node_cpu_s_per_cycle", "{:.3f}"),
        ("per node: forwarder CPU, % of wall per 32 targets", "agent_cpu_pct_per_32", "{:.2f}"),
        ("per node: forwarder RSS (MiB)", "agent_rss_mib_per_agent", "{:.0f}"),
        ("per node: node rule evaluation per cycle (s, wall)", "node_rule_eval_s", "{:.3f}"),
        ("scrape duration mean (ms)", "scrape_mean_ms", "{:.1f}"),
        ("endpoint host RSS, mean per process (MiB)", "host_rss_mib", "{:.0f}"),
        ("samples per series in a 5m window", "window_samples_per_series", "{:.0f}"),
        ("alerts pending or firing (central)", "alerts_active", "{:.0f}"),
        ("load average (1 min, window mean)", "load_avg", "{:.1f}")]


def report(results: list[tuple[int, str, dict]], args) -> None:
    cols = [(size, name) for size, name, _ in results]
    by = {(size, name): r for size, name, r in results}
    print(f"\nscrape/eval interval {args.interval}, step every {args.step_s}s per endpoint, "
          f"{AGENTS} forwarders per layout (agents; node-tier servers), window {args.window}s "
          f"after {args.settle}s settling; the mix of every 16 endpoints: "
          + ", ".join(sorted({f"{sum(k == m[0] for m in series_mix.MIX)} {k}"
                             for k, _ in series_mix.MIX})))
    print("| figure | " + " | ".join(f"{s} {name}" for s, name in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label, k, fmt in ROWS:
        print(f"| {label} | " + " | ".join(fmt.format(by[c][k]) for c in cols) + " |")
    for size, name, r in results:
        if size == results[-1][0]:
            print(f"\ncostliest central rules at {size}, {name} (mean s per evaluation):")
            for seconds, rule, every in r["costliest"]:
                print(f"  {seconds:.3f}  {rule} (every {every})")
    for size in sorted({s for s, _ in cols}):
        one, two = by.get((size, "one-tier")), by.get((size, "two-tier"))
        if one and two:
            print(f"\n{size}: two-tier / one-tier central CPU-seconds per cycle "
                  f"{two['central_cpu_s_per_cycle'] / one['central_cpu_s_per_cycle']:.3f}, "
                  f"rule evaluation per cycle (wall) "
                  f"{two['rule_eval_s_mean'] / one['rule_eval_s_mean']:.3f}")
            for record, (worst, count, _) in two.get("answers_apart", {}).items():
                print(f"  {record}: at most {100 * worst:.2f}% apart over {count} series")
    last = max(s for s, _ in cols)
    one, two = by.get((last, "one-tier")), by.get((last, "two-tier"))
    if one and two:
        ratio = two["central_cpu_s_per_cycle"] / one["central_cpu_s_per_cycle"]
        print(f"goal: two-tier central CPU per cycle at {last} at most a quarter of one-tier's: "
              f"{'met' if ratio <= 0.25 else 'NOT met'} ({ratio:.3f})")


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
    p.add_argument("--one-tier-only", action="store_true",
                   help="no two-tier arm (agents into one central only)")
    p.add_argument("--classic-only", action="store_true",
                   help="no native histograms anywhere (centrals without the flag, forwarders "
                        "with --native-histograms never)")
    p.add_argument("--native-only", action="store_true",
                   help="rules without the classic quantiles (Config(classic_quantiles=False))")
    p.add_argument("--native-quantile-interval", default="",
                   help="the native quantiles in a group of their own at this interval "
                        "(Config(native_quantile_interval=...))")
    args = p.parse_args()
    report(run(args), args)


if __name__ == "__main__":
    main()
