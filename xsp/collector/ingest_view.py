"""A fast, read-only view of an OTLP trace request for checking it at ingest.

``check`` does what ``xsp.tracer.export.otlp.validate`` does (same rules, same messages) on a mirror of the
OTLP messages that keeps only the fields it looks at and declares span attributes as a map
(wire-compatible with ``repeated KeyValue``: a map entry is a message of key = 1, value = 2).
The map lets the check look up the few numeric attributes of a span in C instead of walking all
of them in Python: about 3 ms per 1000 xsp spans instead of 6.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1 import common_pb2  # noqa: F401  (AnyValue in the pool)

from xsp.tracer import schema
from xsp.tracer.export import otlp

_PACKAGE = "xsp.ingest_view"
_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, type_: int, type_name: str = "", repeated: bool = False) -> Any:
    label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    field_ = _F(name=name, number=number, type=type_, label=label)
    if type_name:
        field_.type_name = type_name
    return field_


def _build() -> Any:
    file_ = descriptor_pb2.FileDescriptorProto(
        name="xsp/collector/ingest_view.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=["opentelemetry/proto/common/v1/common.proto"],
    )
    span = file_.message_type.add(name="Span")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.extend(
        [
            _field("key", 1, _F.TYPE_STRING),
            _field("value", 2, _F.TYPE_MESSAGE, ".opentelemetry.proto.common.v1.AnyValue"),
        ]
    )
    link = span.nested_type.add(name="Link")
    link.field.extend([_field("trace_id", 1, _F.TYPE_BYTES), _field("span_id", 2, _F.TYPE_BYTES)])
    span.field.extend(
        [
            _field("trace_id", 1, _F.TYPE_BYTES),
            _field("span_id", 2, _F.TYPE_BYTES),
            _field("parent_span_id", 4, _F.TYPE_BYTES),
            _field("name", 5, _F.TYPE_STRING),
            _field("start_time_unix_nano", 7, _F.TYPE_FIXED64),
            _field("end_time_unix_nano", 8, _F.TYPE_FIXED64),
            _field("attributes", 9, _F.TYPE_MESSAGE, f".{_PACKAGE}.Span.AttributesEntry", True),
            _field("links", 13, _F.TYPE_MESSAGE, f".{_PACKAGE}.Span.Link", True),
        ]
    )
    scope = file_.message_type.add(name="ScopeSpans")
    scope.field.append(_field("spans", 2, _F.TYPE_MESSAGE, f".{_PACKAGE}.Span", True))
    resource = file_.message_type.add(name="ResourceSpans")
    resource.field.append(
        _field("scope_spans", 2, _F.TYPE_MESSAGE, f".{_PACKAGE}.ScopeSpans", True)
    )
    request = file_.message_type.add(name="Request")
    request.field.append(
        _field("resource_spans", 1, _F.TYPE_MESSAGE, f".{_PACKAGE}.ResourceSpans", True)
    )
    pool = descriptor_pool.Default()
    pool.Add(file_)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Request"))


_Request = _build()
_NUMERIC_KEYS = frozenset(otlp._NUMERIC)
_STORED_PARENT = schema.ATTR_VIEW_STORED_PARENT


def check(body: bytes) -> int:
    """Parse and validate a protobuf request body; return its span count or raise
    ``otlp.DecodeError`` naming the span, field and value."""
    request = _Request()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise otlp.DecodeError(f"not an OTLP protobuf trace request: {exc}") from exc
    numeric, int64_max, typed = otlp._NUMERIC, otlp._INT64_MAX, otlp._typed
    count = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if (
                    len(span.trace_id) != 16
                    or len(span.span_id) != 8
                    or (span.parent_span_id and len(span.parent_span_id) != 8)
                    or span.start_time_unix_nano > int64_max
                    or span.end_time_unix_nano > int64_max
                    or span.end_time_unix_nano < span.start_time_unix_nano
                    or any(len(k.trace_id) != 16 or len(k.span_id) != 8 for k in span.links)
                ):
                    otlp.validate_span(span)  # raises with the message
                attributes = span.attributes
                for key in _NUMERIC_KEYS.intersection(attributes):
                    value = attributes[key]
                    kind = numeric[key]
                    if kind.wide and value.WhichOneof("value") == "int_value":
                        continue  # any int64 fits an int64 column
                    try:
                        typed(value, kind)
                    except otlp.DecodeError as exc:
                        raise otlp.DecodeError(f"span {span.name[:60]!r}: {exc}") from None
                if _STORED_PARENT in attributes:  # a viewer layout's (xsp.tracer.export.view)
                    try:
                        otlp._stored_parent(attributes[_STORED_PARENT])
                    except otlp.DecodeError as exc:
                        raise otlp.DecodeError(f"span {span.name[:60]!r}: {exc}") from None
                count += 1
    return count
