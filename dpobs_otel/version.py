"""The one version string (pyproject.toml reads it from here without importing the package)."""
__version__ = "0.1.0"
