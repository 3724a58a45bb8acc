"""The reference pages (docs/reference) are generated from the code and committed: they
match what the code generates now, and the check fails when a name changes."""
from __future__ import annotations

from pathlib import Path

from dpobs_otel import docs_reference, names

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"


def test_the_committed_reference_pages_match_the_code():
    assert docs_reference.stale(REFERENCE) == [], (
        "regenerate: python -m dpobs_otel.docs_reference --write docs/reference")


def test_a_renamed_instrument_makes_the_metrics_page_stale(monkeypatch, capsys):
    renamed = dict(names.INSTRUMENTS)
    row = renamed.pop(names.KEYS)
    renamed["dpobs.client.key.names"] = row._replace(name="dpobs.client.key.names")
    monkeypatch.setattr(names, "INSTRUMENTS", renamed)
    assert docs_reference.stale(REFERENCE) == ["metrics.md"]
    assert docs_reference.main(["--check", str(REFERENCE)]) == 1
    assert "stale: " + str(REFERENCE / "metrics.md") in capsys.readouterr().err


def test_an_edited_copy_of_a_page_is_stale_and_write_restores_it(tmp_path):
    assert docs_reference.main(["--write", str(tmp_path)]) == 0
    assert docs_reference.stale(tmp_path) == []
    alerts = tmp_path / "alerts.md"
    alerts.write_text(alerts.read_text().replace(names.ALERT_WEIGHTS_STALE, "DpobsWeightsOld"))
    assert docs_reference.stale(tmp_path) == ["alerts.md"]


def test_every_instrument_alert_and_command_is_on_its_page():
    from dpobs_otel.cli import COMMANDS
    pages = docs_reference.build()
    assert all(f"`{name}`" in pages["metrics.md"] for name in names.INSTRUMENTS)
    assert all(f"### {a}" in pages["alerts.md"] for a in vars(names).values()
               if isinstance(a, str) and a.startswith("Dpobs") and a[5:6].isupper())
    assert all(f"## dpobs {c}" in pages["cli.md"] for c in COMMANDS)


# Names of the form DPOBS_X / OTEL_X in the package that are no variable it reads.
NOT_VARIABLES = {"OTEL_SDK_COMPONENT",  # names.py: the OTel SDK's component label value
                 "OTEL_EXPORTER_OTLP"}  # the prefix of the OTLP variables, in prose


def test_every_variable_the_package_reads_has_a_row_on_the_settings_page():
    """Each DPOBS_* or OTEL_* name spelled anywhere in the package, DPOBS_AUTO and the
    fallbacks (RANK, SLURM_PROCID) included, is a row: its name, default, what it does and
    what a bad value does."""
    import re

    from dpobs_otel.config import RANK_FALLBACKS
    package = Path(docs_reference.__file__).parent
    spelled = {m for f in package.rglob("*.py")
               for m in re.findall(r"\b(?:DPOBS|OTEL)_[A-Z0-9_]*[A-Z0-9]\b", f.read_text())}
    rows = {line.split("|")[1].strip().strip("`") for line in
            docs_reference.settings_page().splitlines() if line.startswith("| `")}
    rows |= {line.split("|")[2].strip().strip("`") for line in
             docs_reference.settings_page().splitlines() if line.startswith("| `")}
    missing = (spelled - NOT_VARIABLES | set(RANK_FALLBACKS)) - rows
    assert not missing, f"variables without a row on docs/reference/settings.md: {missing}"
    for line in docs_reference.settings_page().splitlines():
        if line.startswith("| `"):  # name(s), type/default, what it does, a bad value: filled
            assert all(cell.strip() for cell in line.strip("|").split("|")), line
