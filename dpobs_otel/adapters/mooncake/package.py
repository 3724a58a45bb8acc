"""What MooncakeInstrumentor instruments, as opentelemetry-python-contrib's package.py says it.

Two wheels provide `mooncake.store`: mooncake-transfer-engine and its -non-cuda build. A
requirement names one of them, so `_instruments` (what instrumentation_dependencies() gives
the launcher's check) names none, and the launcher skips the instrumentor only when the
module is not installed. `_instruments_any` lists both; the extra `dpobs-otel[mooncake]`
installs the first (tests/adapters/test_instrumentation.py holds the two in agreement).
"""

_instruments: tuple[str, ...] = ()
_instruments_any = ("mooncake-transfer-engine-non-cuda == 0.3.13.post1",
                    "mooncake-transfer-engine == 0.3.13")
