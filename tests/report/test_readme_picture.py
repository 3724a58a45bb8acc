"""The README's picture says the exact command that made it (issue 56): the caption above
docs/answers.png names the `dpobs demo` run that docs/guides/report.md tells to refresh it."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readmes_caption_names_the_command_that_made_docs_answers_png():
    guide = (REPO / "docs" / "guides" / "report.md").read_text()
    (made,) = re.findall(r"^\s+(?:\.venv/bin/)?(dpobs demo [^\n]*)$", guide, re.M)
    readme = (REPO / "README.md").read_text().splitlines()
    (image,) = [i for i, line in enumerate(readme) if "(docs/answers.png)" in line]
    caption = next(line for line in reversed(readme[:image]) if line.strip())
    assert f"`{made.strip()}`" in caption, (made, caption)
