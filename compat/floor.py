"""Print the floor constraints: every `name>=X` that pyproject.toml's dependencies (and the
extras named on the command line) declare, as `name==X`, one a line. `make compat`'s floor
cell installs these, so the floors tested are the floors declared."""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
reqs = list(project["dependencies"])
for extra in sys.argv[1:]:
    reqs += project["optional-dependencies"][extra]
for req in reqs:
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", req)
    name, spec = m.group(1), m.group(3).split(";")[0]
    floor = re.search(r">=\s*([^,\s]+)", spec)
    if floor is None:
        sys.exit(f"compat/floor.py: {req!r} declares no floor")
    print(f"{name}=={floor.group(1)}")
