"""Mirrors of OTLP's trace request: the same wire format, with the span message changed.

A mirror parses the bytes an OTLP exporter sends into messages whose span differs from OTLP's in
one field's declaration (the collector's door check declares the attributes a map; the store
worker's column decoder declares them raw bytes), while the request, resource and scope messages
are OTLP's own, every field kept. ``request_class`` builds one from the span message its caller
shaped with ``copy_message``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "copy_message",
    "request_class",
]


def copy_message(
    descriptor: Any, package: str, retarget: dict[str, str] | None = None
) -> descriptor_pb2.DescriptorProto:
    """``descriptor`` as a message of the mirror in ``package``: every field kept, the fields
    named in ``retarget`` pointing at the mirror's messages, nested types left to OTLP's own."""
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    del proto.nested_type[:]
    del proto.enum_type[:]
    for field_ in proto.field:
        if retarget and field_.name in retarget:
            field_.type_name = f".{package}.{retarget[field_.name]}"
    return proto


def request_class(
    package: str, span: descriptor_pb2.DescriptorProto, raw_spans: bool = False
) -> Any:
    """The message class of a request whose spans are ``span`` (named ``Span``, in
    ``package``), or each span's encoded bytes (``raw_spans``), registered once in protobuf's
    default pool."""
    file_ = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}.proto",
        package=package,
        syntax="proto3",
        dependency=[
            common_pb2.DESCRIPTOR.name,
            trace_pb2.DESCRIPTOR.name,
            trace_service_pb2.DESCRIPTOR.name,
        ],
    )
    span.name = "Span"
    scope = copy_message(trace_pb2.ScopeSpans.DESCRIPTOR, package, {"spans": "Span"})
    for field_ in scope.field:
        if raw_spans and field_.name == "spans":  # wire-compatible: a message is its bytes
            field_.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            field_.ClearField("type_name")
    resource = copy_message(
        trace_pb2.ResourceSpans.DESCRIPTOR, package, {"scope_spans": "ScopeSpans"}
    )
    request = copy_message(
        trace_service_pb2.ExportTraceServiceRequest.DESCRIPTOR,
        package,
        {"resource_spans": "ResourceSpans"},
    )
    for proto, name in ((scope, "ScopeSpans"), (resource, "ResourceSpans"), (request, "Request")):
        proto.name = name
    file_.message_type.extend([span, scope, resource, request])
    pool = descriptor_pool.Default()
    pool.Add(file_)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Request"))
