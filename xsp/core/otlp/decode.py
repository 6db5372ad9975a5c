"""OTLP -> span tables (the collector's side): parse a request (protobuf or OTLP/JSON), check it
at the door (``validate``), and turn each ResourceSpans into rows of ``schema.SPAN_SCHEMA`` with
the sender's resource as stored. A viewer layout (``xsp.tracer.export.view``) is undone: its
added spans dropped, moved spans back under their stored parents, full kernel names, a root's
plain name and a level's service back to the run's, so the collector stores what the tracer
stored. Decoding span by span is ``decode_spans``; xsp's own spans, column-wise, ``columns``."""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from xsp.core import schema
from xsp.core.otlp import json_values
from xsp.core.otlp.attributes import NUMERIC, stored_parent, typed_value
from xsp.core.otlp.decode_spans import any_columns
from xsp.core.otlp.json_types import (
    AttributeValue,
    ScopeExtraJson,
    StoredResourceJson,
)
from xsp.core.otlp.wire import ID_KEYS, INT64_MAX, DecodeError

__all__ = [
    "DecodeError",
    "Scopes",
    "SpanColumns",
    "parse_json",
    "parse_protobuf",
    "plain_resource",
    "resource_attributes",
    "resource_id",
    "resource_json",
    "spans_and_scopes",
    "table_from_columns",
    "table_from_resource_spans",
    "validate",
    "validate_span",
]


def table_from_resource_spans(resource_spans: ResourceSpans, sender: str | None = None) -> pa.Table:
    """The spans of one ResourceSpans as rows of ``schema.SPAN_SCHEMA``: xsp's attributes in
    their columns, every other OTLP field in ``schema.OTLP_COLUMNS``; ``sender`` is the
    ``resource_id`` of the resource (null: run.json's one resource). (The collector's store
    worker decodes xsp's own spans column-wise instead: ``columns``, the same table.)"""
    spans, scopes = spans_and_scopes(resource_spans)
    columns, added = any_columns(spans)
    return table_from_columns(columns, added, scopes, sender, len(spans))


#: (first row, (scope name, version, the rest as OTLP/JSON text)) of each scope with spans
Scopes = list[tuple[int, tuple[str, str, str | None]]]


#: Decoded span columns by name: Python lists (span by span: ``decode_spans``) or Arrow arrays
#: already typed (column-wise: ``columns``).
SpanColumns: TypeAlias = dict[str, list[Any] | pa.Array]


def spans_and_scopes(resource_spans: Any) -> tuple[list[Any], Scopes]:
    """The spans of a ResourceSpans (OTLP's or ``columns``' mirror) and its scopes."""
    spans: list[Any] = []
    scopes: Scopes = []
    for scope_spans in resource_spans.scope_spans:
        if scope_spans.spans:
            scopes.append((len(spans), _scope_columns(scope_spans)))
            spans.extend(scope_spans.spans)
    return spans, scopes


def table_from_columns(
    columns: SpanColumns, added: list[int], scopes: Scopes, sender: str | None, n: int
) -> pa.Table:
    """The table of decoded span columns (lists, or arrays already typed), with the scope and
    sender columns, less the rows a viewer layout ``added``."""
    if scopes:
        columns.update(_scope_columns_of(scopes, n))
    if sender is not None:
        columns["resource_id"] = [sender] * n
    arrays = []
    for field_ in schema.SPAN_SCHEMA:
        values = columns.get(field_.name)
        if values is None:
            arrays.append(pa.nulls(n, field_.type))
        elif isinstance(values, pa.Array):
            arrays.append(values)
        elif pa.types.is_dictionary(field_.type):
            arrays.append(pa.array(values, pa.string()).dictionary_encode().cast(field_.type))
        else:
            arrays.append(pa.array(values, field_.type))
    table = pa.Table.from_arrays(arrays, schema=schema.SPAN_SCHEMA)
    if added:
        keep = np.ones(n, dtype=bool)
        keep[added] = False
        table = table.filter(pa.array(keep))
    return table


def _scope_columns_of(scopes: Scopes, n: int) -> dict[str, pa.Array]:
    """The scope columns of ``n`` rows, each scope's from its first row to the next's (rows
    before the first: null), as dictionary arrays built at once: one code a row, not one
    Python value (a request of many senders has a scope each)."""
    firsts = np.array([first for first, _ in scopes] + [n], np.int64)
    lengths = np.diff(firsts)
    out: dict[str, pa.Array] = {}
    for name, at in (("scope_name", 0), ("scope_version", 1), ("scope_extra", 2)):
        values = [scope[at] for _, scope in scopes]
        if name == "scope_extra" and all(v is None for v in values):
            continue  # left all null, as when no scope has anything more
        distinct = list(dict.fromkeys(values))
        code = {value: k for k, value in enumerate(distinct)}
        codes = np.full(n, -1, np.int32)  # -1: null
        codes[firsts[0] :] = np.repeat(np.array([code[v] for v in values], np.int32), lengths)
        nulls = [k for k, v in enumerate(distinct) if v is None]
        indices = pa.array(codes, mask=np.isin(codes, [-1, *nulls]))
        dictionary = pa.array([v if v is not None else "" for v in distinct], pa.string())
        out[name] = pa.DictionaryArray.from_arrays(indices, dictionary).cast(
            schema.SPAN_SCHEMA.field(name).type
        )
    return out


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise DecodeError(f"not an OTLP protobuf trace request: {exc}") from exc
    return request


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse OTLP/JSON (hex trace and span ids, as the spec requires)."""
    from google.protobuf.json_format import ParseDict, ParseError

    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    except RecursionError as exc:  # the C scanner recurses once per nesting level
        raise DecodeError("not an OTLP/JSON trace request: JSON nested too deeply") from exc
    if not isinstance(data, dict):
        raise DecodeError("an OTLP/JSON request is a JSON object with resourceSpans")
    try:
        for resource_spans in data.get("resourceSpans") or []:
            for scope_spans in resource_spans.get("scopeSpans") or []:
                for span in scope_spans.get("spans") or []:
                    for key in ID_KEYS:
                        if span.get(key):
                            span[key] = _hex_to_b64(span[key], key)
                    for link in span.get("links") or []:
                        for key in ("traceId", "spanId"):
                            if link.get(key):
                                link[key] = _hex_to_b64(link[key], key)
        return ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except DecodeError:
        raise
    except (ParseError, AttributeError, TypeError, ValueError, RecursionError) as exc:
        raise DecodeError(f"not an OTLP/JSON trace request: {exc}") from exc


def _hex_to_b64(value: Any, key: str) -> str:
    import base64

    if not isinstance(value, str):
        raise DecodeError(f"{key} must be a hex string")
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError as exc:
        raise DecodeError(f"{key} {value[:40]!r} is not hex") from exc


def validate(request: ExportTraceServiceRequest) -> int:
    """Check every span's ids, times and typed attributes against the columns they will fill;
    return the span count. The message of a DecodeError names the span, the field and the value,
    so one bad span is refused at the door instead of failing its whole spool segment later. Of
    a key that comes twice in a span, the last value is checked: the one the store keeps."""
    count = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                validate_span(span)
                last = {kv.key: kv.value for kv in span.attributes}  # a key twice: the last
                for key, value in last.items():
                    slot = NUMERIC.get(key)
                    if slot is not None or key == schema.ATTR_VIEW_STORED_PARENT:
                        try:
                            if slot is None:
                                stored_parent(value)
                            else:
                                typed_value(value, slot, value.WhichOneof("value"))
                        except DecodeError as exc:
                            raise DecodeError(f"span {span.name[:60]!r}: {exc}") from None
                count += 1
    return count


def validate_span(span: Any) -> None:
    """Check a span's ids and times (any message with Span's field names)."""
    if len(span.trace_id) != 16:
        raise DecodeError(f"span {span.name[:60]!r}: trace_id must be 16 bytes")
    if len(span.span_id) != 8:
        raise DecodeError(f"span {span.name[:60]!r}: span_id must be 8 bytes")
    if span.parent_span_id and len(span.parent_span_id) != 8:
        raise DecodeError(f"span {span.name[:60]!r}: parent_span_id must be 8 bytes")
    for link in span.links:  # link_trace_id, link_span_id: the first link's ids
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            raise DecodeError(
                f"span {span.name[:60]!r}: a link's trace_id must be 16 bytes, its span_id 8"
            )
    for field_ in ("start_time_unix_nano", "end_time_unix_nano"):
        value = getattr(span, field_)
        if value > INT64_MAX:
            raise DecodeError(
                f"span {span.name[:60]!r}: {field_} {value} is past the int64 nanosecond "
                f"range (max {INT64_MAX})"
            )
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise DecodeError(
            f"span {span.name[:60]!r}: end_time_unix_nano {span.end_time_unix_nano} is before "
            f"start_time_unix_nano {span.start_time_unix_nano}"
        )


def resource_json(resource_spans: ResourceSpans) -> StoredResourceJson:
    """The sender's resource as stored (run.json's "resources"): its attributes as OTLP/JSON,
    each value with its type, a level's own service (a viewer layout) back to the run's; its
    dropped count and schema URL where set."""
    listed = json_values.key_values_json(resource_spans.resource.attributes)
    base = next((kv for kv in listed if kv["key"] == schema.RES_SERVICE_BASE), None)
    if base is not None:  # view.level_resource undone: the run's own service name back
        listed = [kv for kv in listed if kv is not base]
        for kv in listed:
            if kv["key"] == schema.RES_SERVICE_NAME:
                kv["value"] = base.get("value", {})
    entry: StoredResourceJson = {"attributes": listed}
    if resource_spans.resource.dropped_attributes_count:
        entry["droppedAttributesCount"] = resource_spans.resource.dropped_attributes_count
    if resource_spans.schema_url:
        entry["schemaUrl"] = resource_spans.schema_url
    return entry


def resource_id(entry: StoredResourceJson) -> str:
    """The key of a stored resource: a hash of its attributes (in any order), dropped count and
    schema URL, so two senders that differ in any attribute are stored apart."""
    canonical = dict(
        entry, attributes=sorted(entry.get("attributes", []), key=lambda kv: kv["key"])
    )
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def plain_resource(entry: StoredResourceJson) -> dict[str, AttributeValue]:
    """A stored resource's attributes as plain values (``json_values.plain``)."""
    return {kv["key"]: json_values.plain(kv.get("value", {})) for kv in entry.get("attributes", [])}


def resource_attributes(resource_spans: ResourceSpans) -> dict[str, AttributeValue]:
    """The resource's attributes as stored: a level's own service (a viewer layout) back to the
    run's, so that the levels of one run are stored as one run."""
    return plain_resource(resource_json(resource_spans))


def _scope_columns(scope_spans: ScopeSpans) -> tuple[str, str, str | None]:
    """A scope's stored name, version and the rest of it as OTLP/JSON text (None when empty)."""
    scope = scope_spans.scope
    extra: ScopeExtraJson = {}
    if scope.attributes:
        extra["attributes"] = json_values.key_values_json(scope.attributes)
    if scope.dropped_attributes_count:
        extra["droppedAttributesCount"] = scope.dropped_attributes_count
    if scope_spans.schema_url:
        extra["schemaUrl"] = scope_spans.schema_url
    text = json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else None
    return scope.name, scope.version, text
