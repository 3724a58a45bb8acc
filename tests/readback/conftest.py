"""Fixtures of the readback tests: processes started here or as children read no DPOBS_*
setting of the environment the suite runs in."""
from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch):
    for var in [v for v in os.environ if v.startswith("DPOBS_")]:
        monkeypatch.delenv(var)


@pytest.fixture
def sd(tmp_path, clean_env):
    """A file_sd directory (not made yet: the first dpobs.start() makes it)."""
    return tmp_path / "sd"
