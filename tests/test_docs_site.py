"""The documentation site (issue 47): `mkdocs build --strict` passes with no warning, in the
suite's loopback-only namespace (so the build reaches no network), and an unlisted page fails
it; the README stays short and every page it links to exists and is in the site's nav."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_site_builds_strict_without_a_warning(tmp_path):
    done = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    api = (tmp_path / "site" / "reference" / "api.html").read_text()
    # mkdocstrings filled the API page from the docstrings, not left the directive.
    assert "Start dpobs in this process" in api and ":::" not in api


def test_nothing_in_the_build_can_reach_the_network():
    """Beside the build in the loopback-only namespace: no plugin that fetches (privacy,
    social), no remote inventory for cross-references, no web fonts."""
    config = _config()
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert plugins == ["search", "mkdocstrings"]
    handler = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    assert "inventories" not in handler and "import" not in handler
    assert config["theme"]["font"] is False


def _nav_pages(nav) -> set[str]:
    out = set()
    for item in nav:
        values = item.values() if isinstance(item, dict) else [item]
        for v in values:
            out |= _nav_pages(v) if isinstance(v, list) else {v}
    return out


def _config() -> dict:
    # mkdocs.yml has no python tags, so the safe loader reads it whole.
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_an_unlisted_page_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "orphan.md").write_text("# Nobody links here\n")
    config = _config() | {"docs_dir": str(docs)}
    config["plugins"] = ["search"]  # the API page's directives are not what is tested here
    (docs / "reference" / "api.md").write_text("# Python API\n")
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    done = _build(path, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stderr, done.stderr


def test_the_readme_is_short_and_links_only_to_pages_of_the_site():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    listed = _nav_pages(_config()["nav"])
    linked = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert len(linked) >= 10, linked
    for target in linked:
        assert (REPO / target).is_file(), target
        if target.endswith(".md"):
            assert target.removeprefix("docs/") in listed, f"{target} is not in mkdocs.yml's nav"


def test_the_readme_picture_is_committed_beside_the_docs():
    images = re.findall(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", (REPO / "README.md").read_text())
    assert images and all((REPO / p).stat().st_size > 10_000 for p in images), images
