"""What TransferQueueInstrumentor instruments, as opentelemetry-python-contrib's package.py
says it: the releases the adapter measures (`make compat` runs each of 0.1.6-0.1.11), which
instrumentation_dependencies() hands the launcher's check and the extra
`dpobs-otel[transferqueue]` installs (tests/adapters/test_instrumentation.py holds the two in
agreement)."""

_instruments = ("transferqueue >= 0.1.6, < 0.2",)
