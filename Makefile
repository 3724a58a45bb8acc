# The README's two commands: `make demo` and `make test`. Both build .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install dashboards kubernetes bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an unpinned resolve pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,dashboards,transferqueue]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/dpobs demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

dashboards: $(STAMP)
	$(BIN)/dpobs dashboards --out dashboards

kubernetes: $(STAMP)
	$(BIN)/dpobs kubernetes --out deploy/kubernetes

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/guard.py

clean:
	rm -rf $(VENV) build *.egg-info
