"""The demo's and compare's own argument errors: a mistyped flag gets the command's own usage,
a nonsensical number argparse's one-line error, both before anything starts; and their
--help imports no torch (it took 5.6 s to appear when it did)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpobs_otel import cli


def _refused(capsys, argv) -> list[str]:
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("command", ["demo", "compare"])
def test_a_mistyped_flag_prints_the_commands_own_usage(capsys, command):
    err = _refused(capsys, [command, "--stepz", "5"])
    assert err[0].startswith(f"usage: dpobs {command} ")
    assert err[-1] == f"dpobs {command}: error: unrecognized arguments: --stepz 5"


@pytest.mark.parametrize("argv,flag", [
    (["demo", "--steps", "-3"], "--steps"), (["demo", "--steps", "0"], "--steps"),
    (["demo", "--trainers", "0"], "--trainers"), (["demo", "--batch-size", "-1"], "--batch-size"),
    (["demo", "--min-len", "0"], "--min-len"), (["demo", "--rollout-ms", "-1"], "--rollout-ms"),
    (["demo", "--train-ms", "nan"], "--train-ms"), (["demo", "--duration", "-5"], "--duration"),
    (["demo", "--async", "-1"], "--async"), (["demo", "--corrupt-at-step", "-2"],
                                             "--corrupt-at-step"),
    (["demo", "--store-latency-ms", "-1"], "--store-latency-ms"),
    (["demo", "--skip-weight-sync-at", "-1"], "--skip-weight-sync-at"),
    (["demo", "--steps", "three"], "--steps"), (["compare", "--steps", "-3"], "--steps"),
    (["compare", "--trainers", "0"], "--trainers")])
def test_a_nonsensical_number_is_a_one_line_argparse_error(capsys, argv, flag):
    err = _refused(capsys, argv)
    assert err[0].startswith(f"usage: dpobs {argv[0]} ")
    assert err[-1].startswith(f"dpobs {argv[0]}: error: argument {flag}: ")
    assert argv[-1] in err[-1]


@pytest.mark.parametrize("command", ["demo", "compare"])
def test_help_imports_no_torch(command):
    code = ("import sys, json\nfrom dpobs_otel import cli\ntry:\n"
            f"    cli.main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in ('torch', 'tensordict', 'ray') "
            "if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"usage: dpobs {command}" in r.stdout
    assert json.loads(r.stdout.splitlines()[-1]) == []
