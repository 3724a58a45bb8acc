"""The `dpobs` command. Each subcommand lives in its own module and is imported lazily,
so `dpobs dashboards` does not pay for torch and `dpobs demo` does not need grafana; the
demo's and compare's modules hold only their flags, so their --help imports no torch."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Each module has add_arguments(parser) and run(args).
COMMANDS = {
    "demo": ("dpobs_otel.demo.command", "run the GRPO-shaped demo workload (--backend memory|...)"),
    "compare": ("dpobs_otel.demo.compare_command", "the demo on each data plane, one table side by side"),
    "mixin": ("dpobs_otel.mixin.tree", "write every operator artifact (rules, configs, dashboards)"),
    "dashboards": ("dpobs_otel.mixin.grafana", "write the Grafana dashboards as JSON"),
    "kubernetes": ("dpobs_otel.mixin.kubernetes", "write the Kubernetes manifests"),
    "agent": ("dpobs_otel.agent.command", "run the per-node Prometheus agent (remote write)"),
    "top": ("dpobs_otel.top.command", "a live terminal view of the answers (no Grafana)"),
    "timeline": ("dpobs_otel.tracing.command",
                 "traced processes' spans as a Perfetto timeline (JSON) and a PNG"),
    "report": ("dpobs_otel.report.command", "one PNG page of the overview's answers"),
    "doctor": ("dpobs_otel.doctor.command",
               "check the chain from a job's processes to its alerts, one line per link"),
}


def main(argv: list[str] | None = None) -> int:
    # The command list is written here, one line each: argparse's own wraps at 80 columns.
    listing = "\n".join(f"  {name:<12}{text}" for name, (_, text) in COMMANDS.items())
    parser = argparse.ArgumentParser(prog="dpobs", description="data-plane observability\n\n"
                                     f"commands:\n{listing}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                 help="one of the commands above; COMMAND --help for more")
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv else None
    for name, (module, helptext) in COMMANDS.items():
        sub = subs.add_parser(name, description=helptext)
        if name == wanted:  # import only the module that will run
            mod = importlib.import_module(module)
            mod.add_arguments(sub)
            sub.set_defaults(_run=mod.run)
    args, extra = parser.parse_known_args(argv)
    if extra:  # a mistyped flag: the command's own usage, not the list of commands
        subs.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
