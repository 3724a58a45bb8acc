"""An independent reader of the delimited protobuf exposition for the tests: message classes
the protobuf runtime builds from a descriptor written here (metrics.proto's field numbers and
types, transcribed from prometheus/client_model, not from our encoder), and the delimiters
read with the runtime's own varint decoder."""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.decoder import _DecodeVarint32

F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"double": F.TYPE_DOUBLE, "uint64": F.TYPE_UINT64, "uint32": F.TYPE_UINT32,
            "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64, "int64": F.TYPE_INT64,
            "string": F.TYPE_STRING}
# message -> [(field name, number, type, repeated)]; a capitalised type is a message.
_MESSAGES = {
    "LabelPair": [("name", 1, "string", 0), ("value", 2, "string", 0)],
    "Gauge": [("value", 1, "double", 0)],
    "Counter": [("value", 1, "double", 0)],
    "Untyped": [("value", 1, "double", 0)],
    "Bucket": [("cumulative_count", 1, "uint64", 0), ("cumulative_count_float", 4, "double", 0),
               ("upper_bound", 2, "double", 0)],
    "BucketSpan": [("offset", 1, "sint32", 0), ("length", 2, "uint32", 0)],
    "Histogram": [("sample_count", 1, "uint64", 0), ("sample_count_float", 4, "double", 0),
                  ("sample_sum", 2, "double", 0), ("bucket", 3, "Bucket", 1),
                  ("schema", 5, "sint32", 0), ("zero_threshold", 6, "double", 0),
                  ("zero_count", 7, "uint64", 0), ("zero_count_float", 8, "double", 0),
                  ("negative_span", 9, "BucketSpan", 1), ("negative_delta", 10, "sint64", 1),
                  ("negative_count", 11, "double", 1), ("positive_span", 12, "BucketSpan", 1),
                  ("positive_delta", 13, "sint64", 1), ("positive_count", 14, "double", 1)],
    "Metric": [("label", 1, "LabelPair", 1), ("gauge", 2, "Gauge", 0),
               ("counter", 3, "Counter", 0), ("untyped", 5, "Untyped", 0),
               ("histogram", 7, "Histogram", 0), ("timestamp_ms", 6, "int64", 0)],
    "MetricFamily": [("name", 1, "string", 0), ("help", 2, "string", 0),
                     ("type", 3, "MetricType", 0), ("metric", 4, "Metric", 1),
                     ("unit", 5, "string", 0)],
}
TYPES = ["COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM"]


def _classes():
    fd = descriptor_pb2.FileDescriptorProto(name="dpobs_test_metrics.proto",
                                            package="io.prometheus.client", syntax="proto3")
    enum = fd.enum_type.add(name="MetricType")
    for i, name in enumerate(TYPES):
        enum.value.add(name=name, number=i)
    for msg, fields in _MESSAGES.items():
        m = fd.message_type.add(name=msg)
        for name, number, kind, repeated in fields:
            f = m.field.add(name=name, number=number,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if kind in _SCALARS:
                f.type = _SCALARS[kind]
            else:
                f.type = F.TYPE_ENUM if kind == "MetricType" else F.TYPE_MESSAGE
                f.type_name = f".io.prometheus.client.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"io.prometheus.client.{n}")) for n in _MESSAGES}


CLASSES = _classes()


def decode(body: bytes) -> list:
    """The MetricFamily messages of a delimited stream, all bytes consumed."""
    out, pos = [], 0
    while pos < len(body):
        size, pos = _DecodeVarint32(body, pos)
        family = CLASSES["MetricFamily"]()
        family.ParseFromString(body[pos:pos + size])
        out.append(family)
        pos += size
    assert pos == len(body)
    return out


def labels(metric) -> dict[str, str]:
    return {p.name: p.value for p in metric.label}


def native_buckets(h) -> dict[int, int]:
    """{Prometheus bucket index: count} of a native histogram's positive side."""
    out, index, count = {}, 0, 0
    deltas = iter(h.positive_delta)
    for span in h.positive_span:
        index += span.offset
        for _ in range(span.length):
            count += next(deltas)
            out[index] = count
            index += 1
    return out
