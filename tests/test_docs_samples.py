"""The documentation's sample outputs are what the commands print now (issue 56: the demo's
page showed a table from before its native, classic and rules rows), and the README says how
to install dpobs from what exists today (a clone, a git URL, a wheel) with every extra.

Regenerate the samples with `python -m dpobs_otel.docs_samples --write docs`."""
from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from dpobs_otel import docs_samples
from dpobs_otel.docs_samples import SAMPLES, blocks, drift, run, structure

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
EXACT = sorted(name for name, s in SAMPLES.items() if s.exact)


def test_every_sample_has_its_block_on_its_page():
    assert sorted(blocks(DOCS)) == sorted(SAMPLES)


@pytest.mark.parametrize("name", EXACT)
def test_an_exact_sample_is_what_its_commands_print(name):
    fresh = run(SAMPLES[name])
    assert blocks(DOCS)[name] == fresh, (
        f"{SAMPLES[name].page}: sample {name} has drifted; run "
        f"python -m dpobs_otel.docs_samples --write docs --only {name}")


# Two runs of one table: other numbers, ports, paths and worst-first order; then one without
# its native rows, as the demo printed before they came.
RUN_A = """Prometheus   http://127.0.0.1:40303
memory: its logs go to /tmp/dpobs-logs-o41u3fdq/memory.log
  op        source     calls  mean ms     p50     p90     p99        MB   share
  get       truth        804    14.04   13.65   17.03   19.95     82.07   71.8%
            native       804    14.05   13.65   17.07   20.26     82.07   71.8%
  trainer 0   127.0.0.1:35639          201    11.1    51.1%    51.3%  |   51.4%       51.3%
  trainer 1   127.0.0.1:36157          201    11.1    50.8%    50.9%  |   51.0%       50.9%
"""
RUN_B = """Prometheus   http://127.0.0.1:9090
memory: its logs go to /tmp/dpobs-logs-zz9q/memory.log
  op        source     calls  mean ms     p50     p90     p99        MB   share
  get       truth         31    25.79   24.08   35.75   43.21      2.07   77.2%
            native        31    25.80   24.15   44.79   49.60      2.07   77.1%
  trainer 1   127.0.0.1:1234           31    20.5    50.7%    50.8%  |   50.8%       50.8%
  trainer 0   127.0.0.1:36963          31    20.5    50.7%    50.8%  |   50.8%       50.8%
"""


def test_structure_ignores_what_differs_between_runs_and_sees_a_missing_row():
    assert structure(RUN_A) == structure(RUN_B)
    assert "op | source | calls | mean ms | p50 | p90 | p99 | MB | share" in structure(RUN_A)
    without_native = "\n".join(ln for ln in RUN_A.splitlines() if "native" not in ln)
    assert "native" in drift("demo-run", without_native, RUN_A)
    assert drift("demo-run", RUN_B, RUN_A) is None


@pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager"))
    and os.environ.get("CI") != "true",
    reason="the demo's rules rows need prometheus and prometheus-alertmanager on PATH")
def test_the_demo_run_sample_has_the_structure_of_a_run_now():
    fresh = run(SAMPLES["demo-run"])
    assert drift("demo-run", blocks(DOCS)["demo-run"], fresh) is None, (
        "docs/start/demo.md's run sample has drifted; run python -m dpobs_otel.docs_samples "
        "--write docs --only demo-run")


def test_the_check_names_a_drifted_block(tmp_path, monkeypatch):
    page = tmp_path / SAMPLES["doctor-nothing"].page
    page.parent.mkdir(parents=True)
    page.write_text("<!-- sample: doctor-nothing; x -->\n```text\n$ dpobs doctor\nold\n```\n")
    monkeypatch.setattr(docs_samples, "SAMPLES", {"doctor-nothing": SAMPLES["doctor-nothing"]})
    assert docs_samples.main(["--check", str(tmp_path)]) == 1
    assert docs_samples.main(["--write", str(tmp_path)]) == 0
    assert docs_samples.main(["--check", str(tmp_path)]) == 0


# -- the README's install lines ---------------------------------------------------------
def _readme() -> str:
    return (REPO / "README.md").read_text()


def test_the_readme_installs_from_a_clone_a_git_url_and_a_wheel():
    text = _readme()
    assert re.search(r"pip install (-e )?\./dpobs-otel\b", text)
    assert re.search(r"pip install 'dpobs-otel @ git\+\S+'", text)
    assert "pip wheel --no-deps . -w dist" in text
    assert "pip install dist/dpobs_otel-*.whl" in text
    assert "finds nothing on PyPI today" in text  # until it is published


def test_the_readme_names_every_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    paragraph = re.search(r"^Extras\b.*?\n\n", _readme(), re.S | re.M).group(0)
    listed = set(re.findall(r"`\[(\w+)\]`", paragraph))
    assert set(extras) <= listed, sorted(set(extras) - listed)
