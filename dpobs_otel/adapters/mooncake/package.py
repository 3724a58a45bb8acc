"""What MooncakeInstrumentor instruments, as opentelemetry-python-contrib's package.py says it.

Several distributions provide the `mooncake` module: mooncake-transfer-engine (CUDA 12),
its -cuda13 build (NeMo-RL's) and its -non-cuda build (CPU). No requirement, and so no extra,
can say "any one of them", so dpobs-otel installs none: `_instruments_any` lists each with
the range the adapter supports, and instrumentation_dependencies() names the one that
provides the module here (tests/adapters/test_instrumentation.py).
"""

_instruments: tuple[str, ...] = ()
_instruments_any = ("mooncake-transfer-engine-non-cuda >= 0.3, < 0.4",
                    "mooncake-transfer-engine >= 0.3, < 0.4",
                    "mooncake-transfer-engine-cuda13 >= 0.3, < 0.4")
