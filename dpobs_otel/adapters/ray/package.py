"""What RayInstrumentor instruments: the Ray releases whose object-store API and serializer the
adapter measures, from NeMo-RL's pin (2.49) to the newest before a major release. The extra
`dpobs-otel[ray]` states the same range (tests/adapters/test_instrumentation.py holds the
two in agreement); outside it a process says once that Ray is left unmeasured."""

_instruments = ("ray >= 2.49, < 3",)
