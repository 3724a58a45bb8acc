"""Prometheus file_sd registration: one JSON file per process, written atomically (a
half-written file would make Prometheus drop the target) and removed on shutdown or exit."""
from __future__ import annotations

import atexit
import json
import os
import tempfile


class FileSDTarget:
    def __init__(self, sd_dir: str, target: str, labels: dict[str, str], name: str):
        os.makedirs(sd_dir, exist_ok=True)
        self.path = os.path.join(sd_dir, f"{name}.json")
        doc = [{"targets": [target], "labels": {k: str(v) for k, v in labels.items()}}]
        fd, tmp = tempfile.mkstemp(dir=sd_dir, prefix=".dpobs-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2, sort_keys=True)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; Prometheus often runs as another user
            os.replace(tmp, self.path)  # Prometheus sees the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
        atexit.register(self.remove)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        atexit.unregister(self.remove)
