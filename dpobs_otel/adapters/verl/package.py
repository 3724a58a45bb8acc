"""What VerlInstrumentor instruments, as opentelemetry-python-contrib's package.py says it: the
verl releases whose `verl.checkpoint_engine` the adapter measures (the base class, its two
methods and `wire_format` as 0.9 has them), which instrumentation_dependencies() hands the
launcher's check and the extra `dpobs-otel[verl]` states (tests/adapters/test_instrumentation.py
holds the two in agreement)."""

_instruments = ("verl >= 0.9, < 0.10",)
