"""Keeps the suite fast (issue 43): every run prints its slowest tests, and a test whose setup,
call and teardown together take longer than LIMIT_S fails the run, unless it is on the
allowlist (helpers/slow_allowlist.py) with its reason. A slow addition is then a decision
written down beside the others, not an accident found when CI hits its limit.

The plugin only reads the reports pytest makes; it never skips, reruns or alters a test. The
over-limit verdict changes the session's exit status and nothing else, so every test's own
outcome stays what it was. tests/conftest.py registers it; docs/development/testing.md has the
measured figures the limit and the allowlist come from."""
from __future__ import annotations

import pytest

from helpers.slow_allowlist import ALLOWED

# A test over this many seconds (setup + call + teardown) fails the run unless allowlisted, by
# its exact id: a parametrized family is listed one case at a time, so a new slow case is a
# decision too.
LIMIT_S = 60.0
# How many of the slowest tests each run prints.
SHOWN = 15


def limit_for(base_s: float, workers, cores: int | None) -> float:
    """The limit of a run in `workers` pytest-xdist workers on `cores` CPUs: a test's wall time
    stretches by up to workers / cores when every worker wants a CPU, so the limit stretches
    with it; alone on the machine (no workers, or no more than the cores) it is base_s. A
    limit of 0 (no verdict) stays 0."""
    try:
        workers = int(workers)
    except (TypeError, ValueError):  # not under xdist, or "auto" (one worker a core)
        return base_s
    return base_s * max(1.0, workers / max(1, cores or 1))


class SlowTests:
    """The plugin object: sums each test's phases, prints the slowest at the end, and turns a
    passing session into a failing one when a test not on the allowlist went over the limit."""

    def __init__(self, limit_s: float = LIMIT_S, allowed: dict[str, str] | None = None,
                 shown: int = SHOWN):
        self.limit_s = limit_s
        self.allowed = ALLOWED if allowed is None else allowed
        self.shown = shown
        # nodeid -> {"setup": s, "call": s, "teardown": s}
        self.phases: dict[str, dict[str, float]] = {}
        self.over: list[tuple[str, float]] = []

    def total(self, nodeid: str) -> float:
        return sum(self.phases[nodeid].values())

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        # Summed, not replaced: a plugin that reruns a phase would report it twice.
        phases = self.phases.setdefault(report.nodeid, {})
        phases[report.when] = phases.get(report.when, 0.0) + report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session):
        # A limit of 0 is none: the run only prints its slowest tests.
        self.over = sorted(((n, self.total(n)) for n in self.phases
                            if 0 < self.limit_s < self.total(n)
                            and n not in self.allowed),
                           key=lambda item: -item[1])
        # Only a clean session is turned into a failing one: a failure or an interrupt keeps
        # its own (more telling) exit status.
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        slowest = sorted(self.phases, key=self.total, reverse=True)[:self.shown]
        if slowest:
            limit = f"limit {self.limit_s:g} s" if self.limit_s else "no limit"
            terminalreporter.write_sep("=", f"{len(slowest)} slowest tests "
                                            f"(setup + call + teardown; {limit})")
            for nodeid in slowest:
                p = self.phases[nodeid]
                mark = " [allowlisted]" if nodeid in self.allowed else ""
                write(f"{self.total(nodeid):8.2f}s  (setup {p.get('setup', 0.0):.2f} "
                      f"call {p.get('call', 0.0):.2f} teardown {p.get('teardown', 0.0):.2f})  "
                      f"{nodeid}{mark}")
        if self.over:
            terminalreporter.write_sep("=", f"tests over the {self.limit_s:g} s limit and not "
                                            f"on the allowlist: {len(self.over)}", red=True)
            for nodeid, seconds in self.over:
                write(f"{seconds:8.2f}s  {nodeid}", red=True)
            write("The run fails for them. Make each faster, or add it with its reason to "
                  "tests/helpers/slow_allowlist.py (docs/development/testing.md).", red=True)
