"""What TransferQueueInstrumentor instruments, as opentelemetry-python-contrib's package.py
says it: the one version the adapter is written against, which instrumentation_dependencies()
hands the launcher's check and the extra `dpobs-otel[transferqueue]` installs
(tests/adapters/test_instrumentation.py holds the two in agreement)."""

_instruments = ("transferqueue >= 0.1.6, < 0.2",)
