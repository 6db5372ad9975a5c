"""Span tables -> OTLP (pure functions shared by the file exporter, the senders and the collector).

``encode_request`` builds an ``ExportTraceServiceRequest`` protobuf straight from the columns,
without OTel SDK span objects; ``request_to_json`` renders it as OTLP/JSON, as the OpenTelemetry
file-exporter and OTLP/HTTP JSON specs ask: lowerCamelCase keys, enums as integers, 64-bit integers
as strings and trace/span ids as hex strings.

A model span that ran inside an application's OpenTelemetry span (``remote_parent_span_id``)
has that span as its parent on the wire, so a tracing backend shows the model under the request;
a reconstruction's root carries an OpenTelemetry span link to it (``link_trace_id``,
``link_span_id``). Decoding puts both back into their columns.

Another sender's fields beyond xsp's (kind, status code and a non-error's message, events, links,
scope, every attribute with its type: ``schema.OTLP_COLUMNS``) are decoded into their columns and
encoded back from them (``_rest_rows``, ``_scope_groups``), as OTLP/JSON where a value has a type
of its own (``otlp_values``); a value under an xsp key whose type is not its column's is kept so
too, and given back instead of the column's conversion (``_given_back``). xsp's own spans leave
them null and pay only a null check per column.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from xsp.core import schema
from xsp.tracer.export import otlp_values
from xsp.tracer.export.kernel_names import short_kernel_name
from xsp.tracer.export.view import WIRE_COLUMNS, level_resource

SCOPE_NAME = "xsp"
_ID_KEYS = ("traceId", "spanId", "parentSpanId")
#: A trace's root takes its title (a single-rank step, or the iteration above the ranks).
_ROOT_KINDS = (schema.KIND_STEP, schema.KIND_ITERATION)
_ROOT_NAMES = {
    schema.KIND_STEP: schema.STEP_SPAN_NAME,
    schema.KIND_ITERATION: schema.ITERATION_SPAN_NAME,
}


def any_value(value: Any) -> AnyValue:
    """A plain value as OTLP; a dict is a typed value kept as OTLP/JSON (``otlp_values``)."""
    if isinstance(value, dict):
        return otlp_values.value_from_json(value)
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items() if v is not None]


def trace_title(resource: Mapping[str, Any], iteration: int | None) -> str:
    """The root's name on the wire, which Jaeger lists traces by: workload, mode and batch, the
    ranks of a multi-rank job, level set (or "reconstructed") and iteration, e.g.
    "torchvision:resnet50 train b64 · MFLG · iteration 3" or "train.py · 2 ranks · MF ·
    iteration 3". The store keeps the plain name ("step", or "iteration" above the ranks)."""
    workload = " ".join(
        str(part)
        for part in (
            resource.get(schema.RES_WORKLOAD),
            resource.get(schema.RES_MODE),
            f"b{resource[schema.RES_BATCH_SIZE]}" if resource.get(schema.RES_BATCH_SIZE) else None,
        )
        if part
    )
    world_size = resource.get(schema.RES_WORLD_SIZE)
    ranks = f"{world_size} ranks" if isinstance(world_size, int) and world_size > 1 else None
    parts = (workload, ranks, resource.get(schema.RES_LEVELS), f"iteration {iteration}")
    return " · ".join(str(p) for p in parts if p)


def wire_resource(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The resource as sent: Jaeger's host key added where it is missing. Jaeger adjusts (or, with
    adjustment off, flags) clock skew between spans whose host keys differ or are absent; its v1
    API, which the UI reads, looks at ``ip`` alone. All of a run's spans come from one clock, so
    they share one key: the run's own ``ip``, else its host name. Another sender's resource
    (no ``xsp.`` attribute: the collector stored it) goes back as it came in."""
    wired = dict(resource)
    ours = any(key.startswith("xsp.") for key in wired)
    if ours and not wired.get(schema.RES_JAEGER_HOST_KEY):
        wired[schema.RES_JAEGER_HOST_KEY] = str(wired.get(schema.RES_HOST_NAME) or "localhost")
    return wired


def _span_rows(
    resource: Mapping[str, Any], table: pa.Table, view: bool = False
) -> Iterator[tuple[bytes, int, int, str, int, int, list[tuple[str, Any]], str | None]]:
    """Each row of ``table`` as the wire has it: trace id, span id, parent id (0: none; an
    application's span above a model span), name (a root's is its trace title; with ``view``, a
    kernel's is its short name, its full name an attribute), start and end ns, the set
    attributes and the error message. Both encoders (protobuf and OTLP/JSON) read spans through
    it."""
    cols = {
        name: table.column(name).to_pylist() for name in table.column_names if name not in _REST
    }
    n = table.num_rows
    remote = cols.get("remote_parent_span_id") or [None] * n
    kinds = cols.get("kind") or [None] * n
    iterations = cols.get("iteration") or [None] * n
    messages = cols.get("status_message") or [None] * n
    attribute_columns = [
        (cols[c.name], c.attribute)
        for c in schema.ATTRIBUTE_COLUMNS
        if c.name in cols and c.attribute is not None
    ]
    attribute_columns += [(cols[name], key) for name, key in WIRE_COLUMNS if name in cols]
    for row in range(n):
        start, parent, name = cols["start_ns"][row], cols["parent_span_id"][row], cols["name"][row]
        attributes = [
            (key, values[row]) for values, key in attribute_columns if values[row] is not None
        ]
        if kinds[row] in _ROOT_KINDS and not parent:
            name = trace_title(resource, iterations[row])
        elif view and kinds[row] == schema.KIND_KERNEL and name:
            short = short_kernel_name(name)
            if short != name:
                attributes.append((schema.ATTR_KERNEL_NAME, name))
                name = short
        yield (
            cols["trace_id"][row],
            cols["span_id"][row],
            parent or remote[row] or 0,
            name,
            start,
            start + cols["dur_ns"][row],
            attributes,
            messages[row],
        )


_REST = frozenset(schema.OTLP_COLUMNS)


def _rest_rows(table: pa.Table) -> list[dict[str, Any] | None]:
    """Each row's OTLP fields beyond xsp's (``schema.OTLP_COLUMNS``, those set), None where it
    has none (every xsp span): both encoders give them back."""
    n = table.num_rows
    rows: list[dict[str, Any] | None] = [None] * n
    for name in schema.OTLP_COLUMNS:
        if name in _SCOPE_COLUMNS or name not in table.column_names:
            continue
        column = table.column(name)
        if column.null_count == n:
            continue
        for row, value in enumerate(column.to_pylist()):
            if value is not None:
                found = rows[row]
                if found is None:
                    found = rows[row] = {}
                found[name] = value
    return rows


#: The columns that group a resource's spans into scopes (ScopeSpans), not fields of a span.
_SCOPE_COLUMNS = ("scope_name", "scope_version", "scope_extra", "resource_id")


def _scope_groups(table: pa.Table, scope_version: str) -> list[tuple[tuple[Any, ...], list[int]]]:
    """The rows of each instrumentation scope, scopes in the order of their first row: a
    stored scope (name, version, the rest as OTLP/JSON text), or xsp's own where none is."""
    n = table.num_rows
    ours = (SCOPE_NAME, scope_version, None)
    if "scope_name" not in table.column_names or table.column("scope_name").null_count == n:
        return [(ours, list(range(n)))]
    names = table.column("scope_name").to_pylist()
    versions = table.column("scope_version").to_pylist()
    extras = table.column("scope_extra").to_pylist()
    groups: dict[tuple[Any, ...], list[int]] = {}
    for row, name in enumerate(names):
        key = ours if name is None else (name, versions[row] or "", extras[row])
        groups.setdefault(key, []).append(row)
    return list(groups.items())


def _status(message: str | None, rest: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The OTLP status code (an int; Any for protobuf's enum type) and message of a row: an
    error's message is ``status_message``, another status's ``status_description``."""
    stored = rest or {}
    code = stored.get("status_code")
    if code is None:
        code = Status.STATUS_CODE_ERROR if message is not None else Status.STATUS_CODE_UNSET
    return int(code), message or stored.get("status_description") or ""


def _given_back(
    attributes: list[tuple[str, Any]], kept: Sequence[Mapping[str, Any]]
) -> list[tuple[str, Any]]:
    """A row's column attributes less those its kept attributes (OTLP/JSON) give back as they
    came: another sender's value of another type under an xsp key, which its column holds
    converted (``_any_columns``)."""
    keys = {item.get("key") for item in kept}
    return [(key, value) for key, value in attributes if key not in keys]


def _span_links(table: pa.Table) -> list[tuple[bytes, int] | None]:
    """Each row's OpenTelemetry span link (trace id, span id), None where it has none."""
    if "link_span_id" not in table.column_names or "link_trace_id" not in table.column_names:
        return [None] * table.num_rows
    traces = table.column("link_trace_id").to_pylist()
    spans = table.column("link_span_id").to_pylist()
    return [(t, s) if t and s else None for t, s in zip(traces, spans, strict=True)]


def by_level(
    resource: Mapping[str, Any], table: pa.Table, view: bool
) -> Iterator[tuple[dict[str, Any], pa.Table]]:
    """The resources and rows of a request: with ``view``, one per level, in stack order, each
    its own service (``view.level_resource``); else the one resource as it is."""
    if not view or "level" not in table.column_names:
        yield dict(resource), table
        return
    levels = table.column("level").cast(pa.string())
    present = set(levels.unique().to_pylist())
    order = [name for name in schema.LEVEL_BY_LETTER.values() if name in present]
    order += sorted(name for name in present if name not in order and name is not None)
    for level in order:
        rows = table.filter(pc.fill_null(pc.equal(levels, level), False))
        yield level_resource(resource, level), rows
    if None in present:
        yield dict(resource), table.filter(pc.is_null(levels))


def encode_resource_spans(
    resource: Mapping[str, Any],
    table: pa.Table,
    scope_version: str = "",
    view: bool = False,
    resource_extra: Mapping[str, Any] | None = None,
) -> ResourceSpans:
    """One ResourceSpans holding every row of ``table`` (rows follow schema.SPAN_SCHEMA), under
    ``resource`` as given (``wire_resource`` adds Jaeger's host key) with the rest of it a
    stored sender's had (``resource_extra``: run.json's "resources" entry, whose
    ``droppedAttributesCount`` and ``schemaUrl`` are read), one ScopeSpans per instrumentation
    scope."""
    extra = resource_extra or {}
    spans = [
        _span(row, link, rest)
        for row, link, rest in zip(
            _span_rows(resource, table, view), _span_links(table), _rest_rows(table), strict=True
        )
    ]
    return ResourceSpans(
        resource=Resource(
            attributes=key_values(wire_resource(resource)),
            dropped_attributes_count=extra.get("droppedAttributesCount", 0),
        ),
        schema_url=extra.get("schemaUrl", ""),
        scope_spans=[
            ScopeSpans(
                scope=_scope(key),
                spans=[spans[row] for row in rows],
                schema_url=(json.loads(key[2]).get("schemaUrl", "") if key[2] else ""),
            )
            for key, rows in _scope_groups(table, scope_version)
        ],
    )


def _scope(key: tuple[Any, ...]) -> InstrumentationScope:
    name, version, extra = key
    scope = InstrumentationScope(name=name, version=version)
    if extra:
        rest = json.loads(extra)
        scope.attributes.extend(otlp_values.key_values_from_json(rest.get("attributes")))
        scope.dropped_attributes_count = int(rest.get("droppedAttributesCount", 0))
    return scope


def _span(
    row: tuple[bytes, int, int, str, int, int, list[tuple[str, Any]], str | None],
    link: tuple[bytes, int] | None,
    rest: Mapping[str, Any] | None,
) -> Span:
    trace_id, span_id, parent, name, start, end, attributes, message = row
    kept = otlp_values.json_from_text(rest.get("attributes")) if rest is not None else []
    if kept:
        attributes = _given_back(attributes, kept)
    code, text = _status(message, rest)
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
        span.kind = rest["span_kind"]
    span.attributes.extend(otlp_values.key_values_from_json(kept))
    for event in rest.get("events") or []:
        span.events.add(
            time_unix_nano=event["time_ns"] or 0,
            name=event["name"] or "",
            attributes=otlp_values.key_values_from_text(event["attributes"]),
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
                attributes=otlp_values.key_values_from_text(stored["attributes"]),
                dropped_attributes_count=stored["dropped_attributes_count"] or 0,
            )
    span.trace_state = rest.get("trace_state") or ""
    span.flags = rest.get("flags") or 0
    for field_ in _DROPPED:
        setattr(span, field_, rest.get(field_) or 0)
    return span


def encode_request(
    resource: Mapping[str, Any],
    table: pa.Table,
    scope_version: str = "",
    view: bool = False,
    resource_extra: Mapping[str, Any] | None = None,
) -> ExportTraceServiceRequest:
    """The request of ``table``'s spans; with ``view``, laid out for a trace viewer (one service
    per level, short kernel names: ``xsp.tracer.export.view``); ``resource_extra`` as
    ``encode_resource_spans``'."""
    return ExportTraceServiceRequest(
        resource_spans=[
            encode_resource_spans(wired, rows, scope_version, view, resource_extra)
            for wired, rows in by_level(resource, table, view)
        ]
    )


def encode_request_json(
    resource: Mapping[str, Any],
    table: pa.Table,
    scope_version: str = "",
    view: bool = False,
    resource_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``request_to_json(encode_request(...))``, built straight from the columns: the same
    OTLP/JSON (hex ids, integer enums, 64-bit integers as strings, defaults left out) at a
    fraction of the cost (protobuf's MessageToDict took about 140 µs a span)."""
    return {
        "resourceSpans": [
            _resource_spans_json(wired, rows, scope_version, view, resource_extra or {})
            for wired, rows in by_level(resource, table, view)
        ]
    }


def _resource_spans_json(
    resource: Mapping[str, Any],
    table: pa.Table,
    scope_version: str,
    view: bool,
    resource_extra: Mapping[str, Any],
) -> dict[str, Any]:
    spans = [
        _span_json(row, link, rest)
        for row, link, rest in zip(
            _span_rows(resource, table, view), _span_links(table), _rest_rows(table), strict=True
        )
    ]
    wired = [
        {"key": key, "value": _json_value(value)}
        for key, value in wire_resource(resource).items()
        if value is not None
    ]
    wire: dict[str, Any] = {"attributes": wired} if wired else {}
    if resource_extra.get("droppedAttributesCount"):
        wire["droppedAttributesCount"] = resource_extra["droppedAttributesCount"]
    resource_spans: dict[str, Any] = {"resource": wire}
    if resource_extra.get("schemaUrl"):
        resource_spans["schemaUrl"] = resource_extra["schemaUrl"]
    scope_spans = []
    for (name, version, extra), rows in _scope_groups(table, scope_version):
        scope: dict[str, Any] = {"name": name} if name else {}
        if version:
            scope["version"] = version
        entry: dict[str, Any] = {"scope": scope}
        if extra:
            rest = json.loads(extra)
            if rest.get("attributes"):
                scope["attributes"] = rest["attributes"]
            if rest.get("droppedAttributesCount"):
                scope["droppedAttributesCount"] = rest["droppedAttributesCount"]
            if rest.get("schemaUrl"):
                entry["schemaUrl"] = rest["schemaUrl"]
        if rows:
            entry["spans"] = [spans[row] for row in rows]
        scope_spans.append(entry)
    resource_spans["scopeSpans"] = scope_spans
    return resource_spans


def _span_json(
    row: tuple[bytes, int, int, str, int, int, list[tuple[str, Any]], str | None],
    link: tuple[bytes, int] | None,
    rest: Mapping[str, Any] | None,
) -> dict[str, Any]:
    trace_id, span_id, parent, name, start, end, attributes, message = row
    span: dict[str, Any] = {"traceId": trace_id.hex(), "spanId": f"{span_id:016x}"}
    if rest is not None and rest.get("trace_state"):
        span["traceState"] = rest["trace_state"]
    if parent:
        span["parentSpanId"] = f"{parent:016x}"
    if rest is not None and rest.get("flags"):
        span["flags"] = rest["flags"]
    if name:
        span["name"] = name
    kind = rest.get("span_kind") if rest is not None else None
    span["kind"] = Span.SPAN_KIND_INTERNAL if kind is None else kind
    if start:
        span["startTimeUnixNano"] = str(start)
    if end:
        span["endTimeUnixNano"] = str(end)
    kept = otlp_values.json_from_text(rest.get("attributes")) if rest is not None else []
    if kept:
        attributes = _given_back(attributes, kept)
    listed = [{"key": k, "value": _json_value(v)} for k, v in attributes] + kept
    if listed:
        span["attributes"] = listed
    status: dict[str, Any] = {}
    code, text = _status(message, rest)
    if text:
        status["message"] = text
    if code:
        status["code"] = code
    span["status"] = status
    if rest is not None and rest.get("events"):
        span["events"] = [_event_json(event) for event in rest["events"]]
    if rest is not None and rest.get("links") is not None:
        span["links"] = [_link_json(stored) for stored in rest["links"]]
    elif link is not None:
        span["links"] = [{"traceId": link[0].hex(), "spanId": f"{link[1]:016x}"}]
    if rest is not None:
        _set_fields(span, rest, _DROPPED_JSON)
    return span


def _same(value: Any) -> Any:
    return value


#: Stored fields and their OTLP/JSON keys, each with its conversion: written where set.
_DROPPED_JSON = (
    ("dropped_attributes_count", "droppedAttributesCount", _same),
    ("dropped_events_count", "droppedEventsCount", _same),
    ("dropped_links_count", "droppedLinksCount", _same),
)
_EVENT_JSON = (
    ("time_ns", "timeUnixNano", str),
    ("name", "name", _same),
    ("attributes", "attributes", json.loads),
    ("dropped_attributes_count", "droppedAttributesCount", _same),
)
_LINK_JSON = (
    ("trace_state", "traceState", _same),
    ("attributes", "attributes", json.loads),
    ("dropped_attributes_count", "droppedAttributesCount", _same),
    ("flags", "flags", _same),
)


def _set_fields(
    out: dict[str, Any],
    stored: Mapping[str, Any],
    fields: tuple[tuple[str, str, Callable[[Any], Any]], ...],
) -> dict[str, Any]:
    """``out`` with each of ``fields`` that ``stored`` sets, converted, under its JSON key."""
    for column, key, convert in fields:
        if stored.get(column):
            out[key] = convert(stored[column])
    return out


def _event_json(event: Mapping[str, Any]) -> dict[str, Any]:
    return _set_fields({}, event, _EVENT_JSON)


def _link_json(stored: Mapping[str, Any]) -> dict[str, Any]:
    ids = {"traceId": (stored["trace_id"] or b"").hex(), "spanId": f"{stored['span_id'] or 0:016x}"}
    return _set_fields(ids, stored, _LINK_JSON)


def _json_value(value: Any) -> dict[str, Any]:
    """An attribute value as OTLP/JSON writes ``any_value(value)``."""
    if isinstance(value, dict):  # a typed value kept as OTLP/JSON (an array, bytes)
        return value
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"doubleValue": "NaN"}
        if math.isinf(value):
            return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON form of a request (hex ids, integer enums)."""
    data = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in _ID_KEYS:
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = _b64_to_hex(link[key])
    return data


def _b64_to_hex(text: str) -> str:
    import base64

    return base64.b64decode(text).hex()


def split_traces(table: pa.Table) -> Iterator[pa.Table]:
    """Yield the rows of each trace, traces in the order of their first row."""
    ordered, sizes = _grouped_by_trace(table)
    offset = 0
    for size in sizes:
        yield ordered.slice(offset, size)
        offset += size


def _grouped_by_trace(table: pa.Table) -> tuple[pa.Table, list[int]]:
    """``table`` with each trace's rows together (traces in the order of their first row, rows
    in their order) and each trace's row count. One sort, not one filter per trace: a service's
    batch holds thousands of one-span traces (each request's model span)."""
    if table.num_rows == 0:
        return table, []
    ids = table.column("trace_id").combine_chunks()
    codes = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)  # first-seen order
    order = np.argsort(codes, kind="stable")
    ordered = table.take(pa.array(order)).combine_chunks()
    return ordered, np.bincount(codes).tolist()


def batches_under(table: pa.Table, max_spans: int) -> Iterator[pa.Table]:
    """Split a table into slices of at most ``max_spans`` rows, never splitting a trace
    unless the trace alone is larger than the limit."""
    ordered, sizes = _grouped_by_trace(table)
    start = rows = 0
    for size in sizes:
        if rows and rows + size > max_spans:
            yield ordered.slice(start, rows)
            start, rows = start + rows, 0
        rows += size
        while rows >= max_spans:  # a trace alone larger than the limit: cut in pieces
            yield ordered.slice(start, max_spans)
            start, rows = start + max_spans, rows - max_spans
    if rows:
        yield ordered.slice(start, rows)


# -- decoding (the collector's side) ---------------------------------------------------------------


class DecodeError(ValueError):
    """A payload that is not a valid OTLP trace request; the message says why."""


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
                    for key in _ID_KEYS:
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
                    slot = _NUMERIC.get(key)
                    if slot is not None or key == schema.ATTR_VIEW_STORED_PARENT:
                        try:
                            if slot is None:
                                _stored_parent(value)
                            else:
                                _typed(value, slot, value.WhichOneof("value"))
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
        if value > _INT64_MAX:
            raise DecodeError(
                f"span {span.name[:60]!r}: {field_} {value} is past the int64 nanosecond "
                f"range (max {_INT64_MAX})"
            )
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise DecodeError(
            f"span {span.name[:60]!r}: end_time_unix_nano {span.end_time_unix_nano} is before "
            f"start_time_unix_nano {span.start_time_unix_nano}"
        )


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return MessageToDict(value)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def resource_json(resource_spans: ResourceSpans) -> dict[str, Any]:
    """The sender's resource as stored (run.json's "resources"): its attributes as OTLP/JSON,
    each value with its type, a level's own service (a viewer layout) back to the run's; its
    dropped count and schema URL where set."""
    listed = otlp_values.key_values_json(resource_spans.resource.attributes)
    base = next((kv for kv in listed if kv["key"] == schema.RES_SERVICE_BASE), None)
    if base is not None:  # view.level_resource undone: the run's own service name back
        listed = [kv for kv in listed if kv is not base]
        for kv in listed:
            if kv["key"] == schema.RES_SERVICE_NAME:
                kv["value"] = base.get("value", {})
    entry: dict[str, Any] = {"attributes": listed}
    if resource_spans.resource.dropped_attributes_count:
        entry["droppedAttributesCount"] = resource_spans.resource.dropped_attributes_count
    if resource_spans.schema_url:
        entry["schemaUrl"] = resource_spans.schema_url
    return entry


def resource_id(entry: Mapping[str, Any]) -> str:
    """The key of a stored resource: a hash of its attributes (in any order), dropped count and
    schema URL, so two senders that differ in any attribute are stored apart."""
    canonical = dict(
        entry, attributes=sorted(entry.get("attributes", []), key=lambda kv: kv["key"])
    )
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def plain_resource(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A stored resource's attributes as plain values (``otlp_values.plain``)."""
    return {kv["key"]: otlp_values.plain(kv.get("value", {})) for kv in entry.get("attributes", [])}


def resource_attributes(resource_spans: ResourceSpans) -> dict[str, Any]:
    """The resource's attributes as stored: a level's own service (a viewer layout) back to the
    run's, so that the levels of one run are stored as one run."""
    return plain_resource(resource_json(resource_spans))


def _scope_columns(scope_spans: ScopeSpans) -> tuple[str, str, str | None]:
    """A scope's stored name, version and the rest of it as OTLP/JSON text (None when empty)."""
    scope = scope_spans.scope
    extra: dict[str, Any] = {}
    if scope.attributes:
        extra["attributes"] = otlp_values.key_values_json(scope.attributes)
    if scope.dropped_attributes_count:
        extra["droppedAttributesCount"] = scope.dropped_attributes_count
    if scope_spans.schema_url:
        extra["schemaUrl"] = scope_spans.schema_url
    text = json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else None
    return scope.name, scope.version, text


def _event_rows(events: Any) -> list[dict[str, Any]]:
    return [
        {
            "time_ns": event.time_unix_nano,
            "name": event.name,
            "attributes": otlp_values.attributes_text(event.attributes),
            "dropped_attributes_count": event.dropped_attributes_count or None,
        }
        for event in events
    ]


def _link_rows(links: Any) -> list[dict[str, Any]] | None:
    """Every link in full, or None when the first link's ids (link_trace_id, link_span_id) say
    all there is (xsp's own: one link, ids only)."""
    if len(links) == 1:
        link = links[0]
        if not (link.trace_state or link.attributes or link.dropped_attributes_count or link.flags):
            return None
    return [
        {
            "trace_id": link.trace_id,
            "span_id": int.from_bytes(link.span_id, "big"),
            "trace_state": link.trace_state or None,
            "flags": link.flags or None,
            "attributes": otlp_values.attributes_text(link.attributes),
            "dropped_attributes_count": link.dropped_attributes_count or None,
        }
        for link in links
    ]


class _Rest:
    """The OTLP fields of a request beyond xsp's (``schema.OTLP_COLUMNS``), one list each,
    made only once a span has one: xsp's own leave them null."""

    __slots__ = ("columns", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.columns: dict[str, list[Any]] = {}

    def set(self, name: str, row: int, value: Any) -> None:
        column = self.columns.get(name)
        if column is None:
            column = self.columns[name] = [None] * self.n
        column[row] = value


def table_from_resource_spans(resource_spans: ResourceSpans, sender: str | None = None) -> pa.Table:
    """The spans of one ResourceSpans as rows of ``schema.SPAN_SCHEMA``: xsp's attributes in
    their columns, every other OTLP field in ``schema.OTLP_COLUMNS``; ``sender`` is the
    ``resource_id`` of the resource (null: run.json's one resource). (The collector's store
    worker decodes xsp's own spans column-wise instead: ``otlp_columns``, the same table.)"""
    spans, scopes = spans_and_scopes(resource_spans)
    columns, added = _any_columns(spans)
    return table_from_columns(columns, added, scopes, sender, len(spans))


#: (first row, (scope name, version, the rest as OTLP/JSON text)) of each scope with spans
Scopes = list[tuple[int, tuple[str, str, str | None]]]


def spans_and_scopes(resource_spans: Any) -> tuple[list[Any], Scopes]:
    """The spans of a ResourceSpans (OTLP's or ``otlp_columns``' mirror) and its scopes."""
    spans: list[Any] = []
    scopes: Scopes = []
    for scope_spans in resource_spans.scope_spans:
        if scope_spans.spans:
            scopes.append((len(spans), _scope_columns(scope_spans)))
            spans.extend(scope_spans.spans)
    return spans, scopes


def table_from_columns(
    columns: dict[str, Any], added: list[int], scopes: Scopes, sender: str | None, n: int
) -> pa.Table:
    """The table of decoded span columns (lists, or arrays already typed), with the scope and
    sender columns, less the rows a viewer layout ``added``."""
    ends = [first for first, _ in scopes[1:]] + [n] if scopes else []
    for (first, (scope_name, version, extra)), end in zip(scopes, ends, strict=True):
        columns.setdefault("scope_name", [None] * n)[first:end] = [scope_name] * (end - first)
        columns.setdefault("scope_version", [None] * n)[first:end] = [version] * (end - first)
        if extra is not None:
            columns.setdefault("scope_extra", [None] * n)[first:end] = [extra] * (end - first)
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


def _any_columns(spans: list[Span]) -> tuple[dict[str, Any], list[int]]:
    """Any request's columns, span by span, and the rows a viewer layout added
    (``xsp.tracer.export.view``: not stored). Tight loop: each protobuf field access costs, so
    touch each once."""
    n = len(spans)
    slots: dict[str, tuple[list[Any], _Kind]] = {}
    for column in schema.ATTRIBUTE_COLUMNS:
        assert column.attribute is not None
        slots[column.attribute] = ([None] * n, _KINDS[column.attribute])
    trace_ids, span_ids, parents, names, starts, durs = [], [], [], [], [], []
    statuses: list[str | None] = []
    link_traces: list[bytes | None] = [None] * n
    link_spans: list[int | None] = [None] * n
    added: list[int] = []  # rows a viewer layout added (xsp.tracer.export.view): not stored
    rest = _Rest(n)
    error_code, unset_code = Status.STATUS_CODE_ERROR, Status.STATUS_CODE_UNSET
    internal = Span.SPAN_KIND_INTERNAL
    taken_in: dict[str, int] = {}  # each column's (or view's) key: the last row that set it
    for row, span in enumerate(spans):
        trace_ids.append(span.trace_id)
        span_ids.append(int.from_bytes(span.span_id, "big"))
        parents.append(int.from_bytes(span.parent_span_id, "big"))
        names.append(span.name)
        start = span.start_time_unix_nano
        starts.append(start)
        durs.append(max(0, span.end_time_unix_nano - start))
        status = span.status
        code = status.code
        if code == error_code:
            statuses.append(status.message)
        else:
            statuses.append(None)
            if code != unset_code:
                rest.set("status_code", row, code)  # OK: status_message cannot say it
            if status.message:  # not an error's: not a failure to the analyses
                rest.set("status_description", row, status.message)
        if span.kind != internal:
            rest.set("span_kind", row, span.kind)
        links = span.links
        if links:
            link_traces[row] = links[0].trace_id
            link_spans[row] = int.from_bytes(links[0].span_id, "big")
            listed = _link_rows(links)
            if listed is not None:
                rest.set("links", row, listed)
        if span.events:
            rest.set("events", row, _event_rows(span.events))
        if span.trace_state:
            rest.set("trace_state", row, span.trace_state)
        if span.flags:
            rest.set("flags", row, span.flags)
        for field_ in _DROPPED:
            count = getattr(span, field_)
            if count:
                rest.set(field_, row, count)
        others = None
        # From the last: a column's (or the view's) key that came again later is skipped, so the
        # last value wins, as in a dict, in OTLP/JSON parsers and in the door's check (a map)
        for kv in reversed(span.attributes):
            key = kv.key
            slot = slots.get(key)
            if slot is not None or key in _VIEW_KEYS:
                if taken_in.get(key) == row:
                    continue
                taken_in[key] = row
            if slot is not None:
                value, kind = kv.value, slot[1]
                which = value.WhichOneof("value")
                slot[0][row] = _typed(value, kind, which)
                if which != kind.own:
                    # another sender's type under an xsp key: the column holds it converted,
                    # the encoders give back the value as it came (``_given_back``)
                    if others is None:
                        others = []
                    others.append(kv)
            elif key in _VIEW_KEYS:
                _undo_view(kv, row, names, parents, added)
            else:
                if others is None:
                    others = []
                others.append(kv)
        if others:
            others.reverse()  # in the order they came
            rest.set("attributes", row, otlp_values.attributes_text(others))
    # after the view's stored parents are back: an application's span above a model span
    kinds = slots[schema.ATTR_KIND][0]
    remote = _remote_parents(trace_ids, span_ids, parents, kinds)
    columns: dict[str, Any] = {
        "trace_id": trace_ids,
        "span_id": span_ids,
        "parent_span_id": parents,
        "remote_parent_span_id": remote,
        "link_trace_id": link_traces,
        "link_span_id": link_spans,
        "name": names,
        "start_ns": starts,
        "dur_ns": durs,
        "status_message": statuses,
    }
    for column in schema.ATTRIBUTE_COLUMNS:
        columns[column.name] = slots[str(column.attribute)][0]
    columns.update(rest.columns)
    for row, kind in enumerate(columns["kind"]):  # a root's wire title back to its plain name
        if kind in _ROOT_NAMES and not parents[row]:
            names[row] = _ROOT_NAMES[kind]
    return columns, added


_DROPPED = ("dropped_attributes_count", "dropped_events_count", "dropped_links_count")


#: The attributes of a viewer layout that the decoder undoes (xsp.tracer.export.view).
_VIEW_KEYS = frozenset(
    (schema.ATTR_KERNEL_NAME, schema.ATTR_VIEW_ADDED, schema.ATTR_VIEW_STORED_PARENT)
)


def _undo_view(
    kv: KeyValue, row: int, names: list[str], parents: list[int], added: list[int]
) -> None:
    """Put back what the viewer layout changed on span ``row``: its full kernel name, its stored
    parent, or leave out a span it added."""
    value = _plain(kv.value)
    if kv.key == schema.ATTR_KERNEL_NAME and isinstance(value, str) and value:
        names[row] = value
    elif kv.key == schema.ATTR_VIEW_ADDED and value is True:
        added.append(row)
    elif kv.key == schema.ATTR_VIEW_STORED_PARENT:
        parents[row] = _stored_parent(kv.value)


def _stored_parent(value: AnyValue) -> int:
    """The span id in ``schema.ATTR_VIEW_STORED_PARENT`` (16 hex digits)."""
    text = _plain(value)
    try:
        if not isinstance(text, str) or len(text) != 16:
            raise ValueError
        return int(text, 16)
    except ValueError:
        raise DecodeError(
            f"{schema.ATTR_VIEW_STORED_PARENT} {str(text)[:40]!r} is not a span id of 16 hex digits"
        ) from None


def _remote_parents(
    trace_ids: list[bytes], span_ids: list[int], parents: list[int], kinds: list[Any]
) -> list[int | None]:
    """The application spans above model spans: a root kind's parent that is no span of the
    request is moved out of ``parents`` (0 there: xsp's tree keeps its root) into the list
    returned (None elsewhere)."""
    remote: list[int | None] = [None] * len(parents)
    known = set(zip(trace_ids, span_ids, strict=True))
    for row, parent in enumerate(parents):
        # a multi-rank iteration's root (``schema.iteration_root_id``: a small id) may travel in
        # another request of the same trace: a rank's step under it stays in xsp's tree
        if (
            parent > _ITERATION_ROOT_IDS
            and kinds[row] in _ROOT_KINDS
            and (trace_ids[row], parent) not in known
        ):
            remote[row], parents[row] = parent, 0
    return remote


#: Span ids at or below this are multi-rank iteration roots (iteration + 1), never an
#: application's (random 64-bit ids).
_ITERATION_ROOT_IDS = 0xFFFF_FFFF


class _Kind:
    """How an attribute column wants its values: an integer within bounds, a float, a string."""

    __slots__ = ("high", "is_float", "key", "low", "own", "type_name", "wide")

    def __init__(self, key: str, type_: pa.DataType) -> None:
        self.key = key
        self.is_float = pa.types.is_floating(type_)
        #: the AnyValue field of the column's own type; a value of another is kept as sent too
        self.own = (
            "double_value"
            if self.is_float
            else "int_value"
            if pa.types.is_integer(type_)
            else "string_value"
        )
        self.type_name = str(type_)
        self.wide = type_ == pa.int64()  # holds any int_value OTLP can carry
        if pa.types.is_integer(type_):
            bits = type_.bit_width
            signed = pa.types.is_signed_integer(type_)
            self.low = -(1 << (bits - 1)) if signed else 0
            self.high = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
        else:
            self.low = self.high = None


_INT64_MAX = (1 << 63) - 1
_KINDS: dict[str, _Kind] = {
    str(c.attribute): _Kind(str(c.attribute), c.type) for c in schema.ATTRIBUTE_COLUMNS
}
_COLUMN_OF = {str(c.attribute): c.name for c in schema.ATTRIBUTE_COLUMNS}
#: The attributes whose values validate() checks: those filling integer or float columns.
_NUMERIC: dict[str, _Kind] = {
    key: kind for key, kind in _KINDS.items() if kind.high is not None or kind.is_float
}


def _typed(value: AnyValue, kind: _Kind, which: str | None) -> Any:
    """An attribute value (``which``: its ``WhichOneof``) as its column wants it (foreign
    senders may use other value types).

    A numeric column takes numbers and numeric strings (``"7"``). Anything else (a bool, an array,
    ``"abc"``, 7.9 for an integer) and a number that does not fit the column (2**40 for an int32
    iteration, an infinite thread id, a 30-digit parameter count) raise DecodeError naming the
    attribute and value: the request is refused before it is acknowledged, rather than stored
    with the value silently dropped or truncated.
    """
    if kind.high is not None:
        if which == "int_value":
            number: Any = value.int_value
        else:
            plain = _plain(value)
            if plain is None:
                return None
            if isinstance(plain, float) and not math.isfinite(plain):
                raise DecodeError(f"{kind.key} {plain!r} is not a finite number")
            try:
                if isinstance(plain, (bool, dict, list)) or (
                    isinstance(plain, float) and not plain.is_integer()
                ):
                    raise TypeError
                number = int(plain)
            except (TypeError, ValueError):
                raise DecodeError(
                    f"{kind.key} {str(plain)[:40]!r} ({which}) is not an integer for its "
                    f"{kind.type_name} column"
                ) from None
        if not kind.low <= number <= kind.high:
            raise DecodeError(
                f"{kind.key} {_short(number)} does not fit its {kind.type_name} column "
                f"({kind.low}..{kind.high})"
            )
        return number
    if kind.is_float:
        if which == "double_value":
            return value.double_value
        plain = _plain(value)
        if plain is None:
            return None
        try:
            if isinstance(plain, (bool, dict, list)):
                raise TypeError
            return float(plain)
        except (TypeError, ValueError, OverflowError):
            raise DecodeError(
                f"{kind.key} {str(plain)[:40]!r} ({which}) is not a number for its "
                f"{kind.type_name} column"
            ) from None
    if which == "string_value":
        return value.string_value
    plain = _plain(value)
    return None if plain is None else str(plain)


def _short(number: int) -> str:
    text = str(number)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"
