"""Span tables -> OTLP (pure functions shared by the file exporter, the senders and the collector).

``encode_request`` builds an ``ExportTraceServiceRequest`` protobuf straight from the columns,
without OTel SDK span objects; ``request_to_json`` renders it as OTLP/JSON, as the OpenTelemetry
file-exporter and OTLP/HTTP JSON specs ask: lowerCamelCase keys, enums as integers, 64-bit integers
as strings and trace/span ids as hex strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from tracer import schema

SCOPE_NAME = "xsp"
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items() if v is not None]


def encode_resource_spans(
    resource: Mapping[str, Any], table: pa.Table, scope_version: str = ""
) -> ResourceSpans:
    """One ResourceSpans holding every row of ``table`` (rows follow schema.SPAN_SCHEMA)."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    attribute_columns = [
        (c.name, c.attribute)
        for c in schema.ATTRIBUTE_COLUMNS
        if c.name in cols and c.attribute is not None
    ]
    spans = []
    for row in range(table.num_rows):
        start = cols["start_ns"][row]
        attrs = [
            KeyValue(key=key, value=any_value(cols[name][row]))
            for name, key in attribute_columns
            if cols[name][row] is not None
        ]
        message = cols["status_message"][row] if "status_message" in cols else None
        status = (
            Status(code=Status.STATUS_CODE_ERROR, message=message)
            if message is not None
            else Status(code=Status.STATUS_CODE_UNSET)
        )
        parent = cols["parent_span_id"][row]
        spans.append(
            Span(
                trace_id=cols["trace_id"][row],
                span_id=cols["span_id"][row].to_bytes(8, "big"),
                parent_span_id=parent.to_bytes(8, "big") if parent else b"",
                name=cols["name"][row],
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=start,
                end_time_unix_nano=start + cols["dur_ns"][row],
                attributes=attrs,
                status=status,
            )
        )
    return ResourceSpans(
        resource=Resource(attributes=key_values(resource)),
        scope_spans=[
            ScopeSpans(
                scope=InstrumentationScope(name=SCOPE_NAME, version=scope_version), spans=spans
            )
        ],
    )


def encode_request(
    resource: Mapping[str, Any], table: pa.Table, scope_version: str = ""
) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[encode_resource_spans(resource, table, scope_version)]
    )


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON form of a request (hex ids, integer enums)."""
    data = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in _ID_KEYS:
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
    return data


def _b64_to_hex(text: str) -> str:
    import base64

    return base64.b64decode(text).hex()


def split_traces(table: pa.Table) -> Iterator[pa.Table]:
    """Yield the rows of each trace, traces in the order of their first row."""
    if table.num_rows == 0:
        return
    ids = table.column("trace_id")
    for trace_id in dict.fromkeys(ids.to_pylist()):
        yield table.filter(pc.equal(ids, pa.scalar(trace_id, pa.binary(16))))


def batches_under(table: pa.Table, max_spans: int) -> Iterator[pa.Table]:
    """Split a table into slices of at most ``max_spans`` rows, never splitting a trace
    unless the trace alone is larger than the limit."""
    batch: list[pa.Table] = []
    rows = 0
    for trace in split_traces(table):
        if rows and rows + trace.num_rows > max_spans:
            yield pa.concat_tables(batch)
            batch, rows = [], 0
        for offset in range(0, trace.num_rows, max_spans):
            piece = trace.slice(offset, max_spans)
            batch.append(piece)
            rows += piece.num_rows
            if rows >= max_spans:
                yield pa.concat_tables(batch)
                batch, rows = [], 0
    if batch:
        yield pa.concat_tables(batch)
