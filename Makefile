# The README's two commands: `make demo` and `make test`. `make test` builds .venv (the suite's
# whole environment) on first use, `make demo` the light .venv-demo; neither touches the other.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Wheels the suite installs offline into a fresh virtualenv (tests/test_wheel.py): fetched
# here, with the network, since the suite runs without one.
WHEELS := .wheels
WHEEL_STAMP := $(WHEELS)/.downloaded
WHEEL_EXTRAS := dashboards,instrument,top

.PHONY: demo test install dashboards kubernetes bench clean compat docs docs-serve

# pyproject.toml declares ranges; the suite runs the one point of them in SUITE_PINS.
SUITE_PINS := constraints/suite.txt
# verl and what `import verl.checkpoint_engine` needs on the CPU (the rest of it is Ray,
# torch, numpy, omegaconf..., already in the suite's environment).
VERL_IMPORT := verl transformers huggingface-hub tokenizers safetensors regex tqdm httpx \
  httpcore h11 anyio codetiming orjson fastapi starlette annotated-doc uvicorn

$(STAMP): pyproject.toml setup.py dpobs_otel/guard/_rowsums.c dpobs_otel/adapters/ray/_fast.c $(SUITE_PINS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an unpinned resolve pulls a multi-GB CUDA build.
	$(BIN)/pip install -q -c $(SUITE_PINS) torch
	# Mooncake has no extra (pyproject.toml): the suite installs its non-CUDA build itself, and
	# NIXL's wheel (tests/weights/test_live_nixl.py: its UCX runs over TCP on lo, no GPU).
	$(BIN)/pip install -q -c $(SUITE_PINS) -e '.[test,dashboards,transferqueue,instrument,top,otlp,timeline,report,docs]' \
	  mooncake-transfer-engine-non-cuda nixl-cu12
	# verl 0.9 (tests/adapters/verl): its metadata wants tensordict<=0.10 (the suite runs 0.15)
	# and a GPU stack, none of which verl.checkpoint_engine imports on the CPU. So verl goes in
	# without its dependencies, beside only the small ones that import needs, each pinned.
	$(BIN)/pip install -q -c $(SUITE_PINS) --no-deps $(VERL_IMPORT)
	# An editable install leaves out the DPOBS_AUTO start-up hook a wheel installs (setup.py).
	cp dpobs_otel/dpobs-otel-auto.pth "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	touch $(STAMP)

$(WHEEL_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip download -q -c $(SUITE_PINS) -d $(WHEELS) torch '.[$(WHEEL_EXTRAS)]'
	touch $(WHEEL_STAMP)

install: $(STAMP) $(WHEEL_STAMP)

# The demo's own environment: what `dpobs demo` imports on the built-in store (torch, a hard
# dependency, pinned first as above) and the picture it draws at the end ([report]), none of
# the suite's test tools, docs toolchain, verl, NIXL, transformers or Mooncake (half of
# .venv's size, measured: README.md, "Two commands"). A venv of its own, so `make demo` and
# `make test` run in either order on one clone. Editable, like .venv, so the demo runs the
# clone's code as it is now; no DPOBS_AUTO hook: the built-in store's processes start dpobs
# themselves. --backend ray (DPOBS_AUTO=1 in its actors), transferqueue and mooncake need
# libraries only .venv has: run them from .venv/bin/dpobs.
DEMO_VENV := .venv-demo
DEMO_BIN := $(DEMO_VENV)/bin
DEMO_STAMP := $(DEMO_VENV)/.installed
DEMO_EXTRAS := report

$(DEMO_STAMP): pyproject.toml setup.py dpobs_otel/guard/_rowsums.c dpobs_otel/adapters/ray/_fast.c $(SUITE_PINS)
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_BIN)/pip install -q --upgrade pip
	$(DEMO_BIN)/pip install -q -c $(SUITE_PINS) torch
	$(DEMO_BIN)/pip install -q -c $(SUITE_PINS) -e '.[$(DEMO_EXTRAS)]'
	touch $(DEMO_STAMP)

# DEMO_ARGS passes options through: make demo DEMO_ARGS="--steps 30 --verify-tensor-hash".
demo: $(DEMO_STAMP)
	$(DEMO_BIN)/dpobs demo $(DEMO_ARGS)

# The suite must never send a packet off this machine. As root, with unshare and ip at hand,
# pytest runs in a fresh network namespace whose only interface is loopback; otherwise it runs
# as is, and says so (tests/test_network.py fails then under CI=true). Installing stays
# outside: $(STAMP) is built before the recipe, with the network.
LOOPBACK_ONLY := unshare --net sh -c 'ip link set lo up && exec "$$0" "$$@"'
# Two passes (docs/development/testing.md): every test not marked `alone`, then the tests
# that compare two clocks (`alone`, tests/conftest.py) with nothing beside them. A pass that
# selects nothing (PYTEST_ARGS naming one file) is not a failure; both are.
# The first pass runs in TEST_WORKERS pytest-xdist workers, a module to a worker: most tests
# wait on sockets, scrapes and clusters, which four workers overlap on 2 cores (about 15
# minutes instead of 33 here). Each worker has its own Ray temp dir and ports
# (tests/helpers/parallel.py). TEST_WORKERS=1 runs it serially.
# A worker that dies ends the run (--max-worker-restart=0): xdist would start another, and with
# --dist loadfile a run was seen to wait forever after one (make compat's nemo-rl cell).
TEST_WORKERS ?= 4
ifeq ($(TEST_WORKERS),1)
PARALLEL :=
else
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0
endif

test: $(STAMP) $(WHEEL_STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v ip >/dev/null && unshare --net true 2>/dev/null; then \
	  echo "make test: running inside a loopback-only network namespace (unshare --net)"; \
	  run() { $(LOOPBACK_ONLY) "$$@"; }; \
	else \
	  echo "make test: NOT network-isolated (needs root, unshare and iproute2's ip):" \
	       "running on the host network"; \
	  run() { "$$@"; }; \
	fi; \
	run $(BIN)/python -m pytest -q $(PARALLEL) -m 'not alone' $(PYTEST_ARGS); a=$$?; \
	echo "make test: the tests marked alone, serially"; \
	run $(BIN)/python -m pytest -q -m alone $(PYTEST_ARGS); b=$$?; \
	if [ $$a = 5 ] && [ $$b = 5 ]; then \
	  echo "make test: pytest collected no tests (exit 5): a failure"; exit 5; fi; \
	[ $$a = 5 ] && a=0; [ $$b = 5 ] && b=0; \
	if [ $$a != 0 ]; then exit $$a; fi; exit $$b

# The compatibility matrix (compat/cells.toml: verl 0.9, NeMo-RL, ROLL, the declared floors,
# the newest releases; every TransferQueue 0.1.6-0.1.11; the dry-run resolutions beside each
# framework's pins). compat/run.py builds each cell's virtualenv with the network, runs its
# checks in a loopback-only namespace, deletes it; exits non-zero if any cell fails.
compat: $(STAMP)
	$(BIN)/python compat/run.py $(COMPAT_ARGS)

# The documentation site (mkdocs.yml): strict, so a broken link, a missing page or a page
# left out of the navigation fails; its reference pages are checked against the code first.
docs: $(STAMP)
	$(BIN)/python -m dpobs_otel.docs_reference --check docs/reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

dashboards: $(STAMP)
	$(BIN)/dpobs dashboards --out dashboards

kubernetes: $(STAMP)
	$(BIN)/dpobs kubernetes --out deploy/kubernetes

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/guard.py

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(WHEELS) build *.egg-info
