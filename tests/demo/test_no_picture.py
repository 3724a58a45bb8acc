"""`make demo` on a machine without Prometheus ends by naming the fix: the Debian packages
the demo's stack needs, or --sd-dir DIR (a picture from the processes' own endpoints)."""
from __future__ import annotations

from dpobs_otel import cli


def test_a_demo_without_prometheus_names_how_to_get_its_picture(capfd, tmp_path):
    code = cli.main(["demo", "--stack", "off", "--steps", "1", "--trainers", "1",
                     "--batch-size", "4", "--log-dir", str(tmp_path)])
    out = capfd.readouterr().out.splitlines()
    assert code == 0
    ending = out[-1]
    assert ending.startswith("No picture: the demo ran without Prometheus and without --sd-dir")
    assert "apt install prometheus prometheus-alertmanager" in ending  # Debian's names
    assert "--sd-dir DIR" in ending
