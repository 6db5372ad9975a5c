"""Span tables -> OTLP protobuf (``ExportTraceServiceRequest``), straight from the columns,
without OTel SDK span objects.

A model span that ran inside an application's OpenTelemetry span (``remote_parent_span_id``)
has that span as its parent on the wire, so a tracing backend shows the model under the request;
a reconstruction's root carries an OpenTelemetry span link to it (``link_trace_id``,
``link_span_id``). Another sender's fields beyond xsp's (kind, status code and a non-error's
message, events, links, scope, every attribute with its type: ``schema.OTLP_COLUMNS``) are
encoded back from their columns, as OTLP/JSON where a value has a type of its own (``json_values``);
a value under an xsp key whose type is not its column's is given back as it came instead of the
column's conversion (``rows.given_back``). xsp's own spans leave them null and pay only a null
check per column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from xsp.core.otlp import json_values
from xsp.core.otlp.attributes import any_value, key_values
from xsp.core.otlp.json_types import AttributeValue, ScopeExtraJson, StoredResourceJson
from xsp.core.otlp.rows import (
    PLAIN,
    ScopeKey,
    SpanRow,
    WireLayout,
    given_back,
    rest_rows,
    scope_groups,
    span_links,
    span_rows,
    status_of,
)
from xsp.core.otlp.stored import RestRow
from xsp.core.otlp.wire import DROPPED

__all__ = ["encode_resource_spans", "encode_resources"]


def encode_resources(
    groups: Iterable[tuple[Mapping[str, AttributeValue], pa.Table]],
    scope_version: str = "",
    layout: WireLayout = PLAIN,
    resource_extra: StoredResourceJson | None = None,
) -> ExportTraceServiceRequest:
    """The request of each (resource, rows) of ``groups``, one ResourceSpans each, dressed by
    ``layout``; ``resource_extra`` as ``encode_resource_spans``'."""
    return ExportTraceServiceRequest(
        resource_spans=[
            encode_resource_spans(resource, rows, scope_version, layout, resource_extra)
            for resource, rows in groups
        ]
    )


def encode_resource_spans(
    resource: Mapping[str, AttributeValue],
    table: pa.Table,
    scope_version: str = "",
    layout: WireLayout = PLAIN,
    resource_extra: StoredResourceJson | None = None,
) -> ResourceSpans:
    """One ResourceSpans holding every row of ``table`` (rows follow schema.SPAN_SCHEMA), under
    ``resource`` as ``layout`` sends it (xsp's adds Jaeger's host key: ``layout.wire_resource``) with the rest of it a
    stored sender's had (``resource_extra``: run.json's "resources" entry, whose
    ``droppedAttributesCount`` and ``schemaUrl`` are read), one ScopeSpans per instrumentation
    scope."""
    extra: StoredResourceJson = resource_extra or {}
    spans = [
        _span(row, link, rest)
        for row, link, rest in zip(
            span_rows(resource, table, layout), span_links(table), rest_rows(table), strict=True
        )
    ]
    return ResourceSpans(
        resource=Resource(
            attributes=key_values(layout.resource(resource)),
            dropped_attributes_count=extra.get("droppedAttributesCount", 0),
        ),
        schema_url=extra.get("schemaUrl", ""),
        scope_spans=[
            ScopeSpans(
                scope=_scope(key),
                spans=[spans[row] for row in rows],
                schema_url=(json.loads(key[2]).get("schemaUrl", "") if key[2] else ""),
            )
            for key, rows in scope_groups(table, scope_version)
        ],
    )


def _scope(key: ScopeKey) -> InstrumentationScope:
    name, version, extra = key
    scope = InstrumentationScope(name=name, version=version)
    if extra:
        rest: ScopeExtraJson = json.loads(extra)
        scope.attributes.extend(json_values.key_values_from_json(rest.get("attributes")))
        scope.dropped_attributes_count = int(rest.get("droppedAttributesCount", 0))
    return scope


def _span(
    row: SpanRow,
    link: tuple[bytes, int] | None,
    rest: RestRow | None,
) -> Span:
    trace_id, span_id, parent, name, start, end, attributes, message = row
    kept = json_values.json_from_text(rest.get("attributes")) if rest is not None else []
    if kept:
        attributes = given_back(attributes, kept)
    code, text = status_of(message, rest)
    span = Span(
        trace_id=trace_id,
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=[KeyValue(key=key, value=any_value(value)) for key, value in attributes],
        status=Status(code=code, message=text),
        links=[Span.Link(trace_id=link[0], span_id=link[1].to_bytes(8, "big"))]
        if link is not None
        else [],
    )
    if rest is None:
        return span
    if "span_kind" in rest:
        span.kind = Span.SpanKind.ValueType(rest["span_kind"])
    span.attributes.extend(json_values.key_values_from_json(kept))
    for event in rest.get("events") or []:
        span.events.add(
            time_unix_nano=event["time_ns"] or 0,
            name=event["name"] or "",
            attributes=json_values.key_values_from_text(event["attributes"]),
            dropped_attributes_count=event["dropped_attributes_count"] or 0,
        )
    if rest.get("links") is not None:
        del span.links[:]
        for stored in rest["links"]:
            span.links.add(
                trace_id=stored["trace_id"] or b"",
                span_id=(stored["span_id"] or 0).to_bytes(8, "big"),
                trace_state=stored["trace_state"] or "",
                flags=stored["flags"] or 0,
                attributes=json_values.key_values_from_text(stored["attributes"]),
                dropped_attributes_count=stored["dropped_attributes_count"] or 0,
            )
    span.trace_state = rest.get("trace_state") or ""
    span.flags = rest.get("flags") or 0
    for field_ in DROPPED:
        setattr(span, field_, rest.get(field_) or 0)
    return span
