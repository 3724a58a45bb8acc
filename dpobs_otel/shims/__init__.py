"""Shims over other libraries' internals: the only modules that read names those libraries do
not promise to keep, each pinned by its test under tests/shims/.

- otel_sdk.py: every private name of the OpenTelemetry SDK and its Prometheus exporter, each
  behind a guard with a public fallback;
- otel_histogram.py: the op duration's record bound straight into the SDK's aggregation
  (through otel_sdk's names);
- torch_jagged.py: torch's private attributes of jagged nested tensors;
- asyncio_tasks.py: what an asyncio task awaits (CPython's private task and future fields).
"""
