"""OTLP requests of xsp's own spans -> span columns without a Python object per attribute.

``otlp.table_from_resource_spans`` reads each attribute through protobuf's Python objects
(a KeyValue, its AnyValue, a ``WhichOneof``): about 0.7 µs an attribute, nine a span, most of
the collector's store worker's time. Here the request is parsed with a mirror of OTLP's messages
whose span attributes are ``repeated bytes`` (wire-compatible with ``repeated KeyValue``), so the
attributes of a whole request come out as one buffer, and their keys and values are decoded from
it with numpy, the way capture's records are: every KeyValue at once, field by field.

Only the common case is decoded so: spans of kind INTERNAL with status ERROR or UNSET (without a
message), no events, trace state, flags or dropped counts, links with ids only, and every
attribute one that a column holds, with its column's own value type (string, int or double) and
once per span. Any other request (another sender's, a viewer layout's) is parsed as OTLP and
decoded span by span (``otlp._any_columns``), into the same table.
"""

from __future__ import annotations

import operator
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from xsp.tracer import schema
from xsp.tracer.export import otlp, otlp_mirror

_PACKAGE = "xsp.otlp_columns"
_F = descriptor_pb2.FieldDescriptorProto


def _build() -> Any:
    span = otlp_mirror.copy_message(trace_pb2.Span.DESCRIPTOR, _PACKAGE)
    for field_ in span.field:
        if field_.name == "attributes":  # each KeyValue as its encoded bytes
            field_.type = _F.TYPE_BYTES
            field_.ClearField("type_name")
    return otlp_mirror.request_class(_PACKAGE, span)


_Request = _build()


def parse_request(body: bytes) -> Any:
    """A protobuf request body as the mirror (its resources and scopes are OTLP's own)."""
    request = _Request()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise otlp.DecodeError(f"not an OTLP protobuf trace request: {exc}") from exc
    return request


def table_from_resource_spans(resource_spans: Any, sender: str | None = None) -> pa.Table:
    """``otlp.table_from_resource_spans`` of a mirror's ResourceSpans: the same table."""
    spans, scopes = otlp.spans_and_scopes(resource_spans)
    columns = _common_columns(spans)
    added: list[int] = []
    if columns is None:  # not xsp's common case: OTLP's own messages, span by span
        columns, added = otlp._any_columns([Span.FromString(s.SerializeToString()) for s in spans])
    return otlp.table_from_columns(columns, added, scopes, sender, len(spans))


_ZERO_ID = bytes(8)
_KIND_OF = operator.attrgetter("kind")
_STATUS_OF = operator.attrgetter("status")
_CODE_OF = operator.attrgetter("code")
_MESSAGE_OF = operator.attrgetter("message")
_SPAN_ID_OF = operator.attrgetter("span_id")
_PARENT_OF = operator.attrgetter("parent_span_id")
_TRACE_ID_OF = operator.attrgetter("trace_id")
_NAME_OF = operator.attrgetter("name")
_START_OF = operator.attrgetter("start_time_unix_nano")
_END_OF = operator.attrgetter("end_time_unix_nano")
_LINKS_OF = operator.attrgetter("links")
_EVENTS_OF = operator.attrgetter("events")
_ATTRIBUTES_OF = operator.attrgetter("attributes")
_REST_OF = operator.attrgetter(
    "trace_state", "flags", "dropped_attributes_count", "dropped_events_count",
    "dropped_links_count",
)  # fmt: skip
_NO_REST = ("", 0, 0, 0, 0)


def _common_columns(spans: list[Any]) -> dict[str, Any] | None:
    """The columns of mirror spans in xsp's common case, one field of every span at a time;
    None where a span has anything else."""
    n = len(spans)
    if (
        not n
        or list(map(_KIND_OF, spans)).count(Span.SPAN_KIND_INTERNAL) != n
        or any(map(len, map(_EVENTS_OF, spans)))
        or list(map(_REST_OF, spans)).count(_NO_REST) != n
    ):
        return None
    statuses = list(map(_STATUS_OF, spans))
    codes = np.fromiter(map(_CODE_OF, statuses), np.int64, n)
    error = codes == Status.STATUS_CODE_ERROR
    if not (error | (codes == Status.STATUS_CODE_UNSET)).all():
        return None
    texts = list(map(_MESSAGE_OF, statuses))
    if any(texts) and np.fromiter(map(bool, texts), bool, n)[~error].any():
        return None  # an UNSET status with a message (``status_description``)
    messages: list[str | None] = [None] * n
    for row in np.flatnonzero(error).tolist():
        messages[row] = texts[row]
    ids = list(map(_SPAN_ID_OF, spans))
    parents = [parent or _ZERO_ID for parent in map(_PARENT_OF, spans)]
    if set(map(len, ids)) != {8} or set(map(len, parents)) != {8}:
        return None
    starts = np.fromiter(map(_START_OF, spans), np.uint64, n)
    ends = np.fromiter(map(_END_OF, spans), np.uint64, n)
    if max(int(starts.max()), int(ends.max())) > otlp._INT64_MAX:
        return None
    start_ns, end_ns = starts.astype(np.int64), ends.astype(np.int64)
    links = _links(spans)
    attributes = _attribute_columns(list(map(_ATTRIBUTES_OF, spans)), n)
    if links is None or attributes is None:
        return None
    columns: dict[str, Any] = {
        "trace_id": list(map(_TRACE_ID_OF, spans)),
        "span_id": pa.array(np.frombuffer(b"".join(ids), ">u8").astype(np.uint64)),
        "name": list(map(_NAME_OF, spans)),
        "start_ns": pa.array(start_ns),
        "dur_ns": pa.array(np.maximum(end_ns - start_ns, 0)),
        "status_message": messages,
        "link_trace_id": links[0],
        "link_span_id": links[1],
        **attributes,
    }
    parent_ids = np.frombuffer(b"".join(parents), ">u8").astype(np.uint64)
    columns["remote_parent_span_id"] = _roots(columns, parent_ids, n)
    columns["parent_span_id"] = pa.array(parent_ids)
    return columns


def _roots(columns: dict[str, Any], parent_ids: np.ndarray, n: int) -> list[int | None]:
    """As ``_any_columns`` does, for the few steps and iterations: an application's span above
    one moved out of ``parent_ids`` into the list returned, a root's wire title back to its
    plain name."""
    remote: list[int | None] = [None] * n
    kinds = columns["kind"].dictionary_decode() if "kind" in columns else pa.nulls(n, pa.string())
    roots = np.flatnonzero(pc.fill_null(pc.is_in(kinds, pa.array(otlp._ROOT_KINDS)), False))
    if not len(roots):
        return remote
    traces, names = columns["trace_id"], columns["name"]
    known = set(zip(traces, columns["span_id"].to_pylist(), strict=True))
    root_kinds = kinds.take(pa.array(roots)).to_pylist()
    for row, kind in zip(roots.tolist(), root_kinds, strict=True):
        parent = int(parent_ids[row])
        if parent > otlp._ITERATION_ROOT_IDS and (traces[row], parent) not in known:
            remote[row] = parent
            parent_ids[row] = parent = 0
        if not parent:
            names[row] = otlp._ROOT_NAMES[kind]
    return remote


def _links(spans: list[Any]) -> tuple[list[bytes | None], list[int | None]] | None:
    """``link_trace_id`` and ``link_span_id``; None where a span's links say more than the
    first one's ids (``otlp._link_rows``)."""
    n = len(spans)
    traces: list[bytes | None] = [None] * n
    span_ids: list[int | None] = [None] * n
    for row, links in enumerate(map(_LINKS_OF, spans)):
        if links:
            if otlp._link_rows(links) is not None:
                return None
            traces[row] = links[0].trace_id
            span_ids[row] = int.from_bytes(links[0].span_id, "big")
    return traces, span_ids


#: The AnyValue field (its tag byte) of each attribute column's own values: string = 1,
#: int = 3 (varint), double = 4 (64-bit).
_STRING, _INT, _DOUBLE = 0x0A, 0x18, 0x21
_TAG_OF = {
    key: _DOUBLE if kind.is_float else _STRING if kind.high is None else _INT
    for key, kind in otlp._KINDS.items()
}
_COLUMN_OF = {str(c.attribute): c.name for c in schema.ATTRIBUTE_COLUMNS}


def _attribute_columns(per_span: list[Any], n: int) -> dict[str, pa.Array] | None:
    """The attribute columns from the encoded KeyValues of each span: ``key`` (field 1) then
    ``value`` (field 2, an AnyValue of one field), all decoded at once; None where one is laid
    out otherwise, names no column, has another value type than its column's or comes twice in
    a span."""
    counts = np.fromiter(map(len, per_span), np.int64, n)
    blobs = list(chain.from_iterable(per_span))
    m = len(blobs)
    if not m:
        return {}
    rows = np.repeat(np.arange(n), counts)
    lengths = np.fromiter(map(len, blobs), np.int64, m)
    data = pa.py_buffer(b"".join(blobs) + bytes(16))  # varints read past no end
    buf = np.frombuffer(data, np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if (lengths < 5).any() or (buf[starts] != 0x0A).any():
        return None
    key_len, size = _lengths(buf, starts + 1)
    key_at = starts + 1 + size
    value_tag = key_at + key_len
    if (value_tag + 1 >= ends).any() or (buf[value_tag] != 0x12).any():
        return None
    value_len, size = _lengths(buf, value_tag + 1)
    value_at = value_tag + 1 + size
    if (value_len < 2).any() or (value_at + value_len != ends).any():
        return None
    keys = _strings(data, key_at, key_len)
    tags = buf[value_at]
    payloads = _payloads(data, buf, tags, value_at + 1, ends)
    if keys is None or payloads is None:
        return None
    encoded = keys.dictionary_encode()
    codes = encoded.indices.to_numpy()
    columns: dict[str, pa.Array] = {}
    for code, key in enumerate(encoded.dictionary.to_pylist()):
        tag = _TAG_OF.get(key)
        group = np.flatnonzero(codes == code)
        at = rows[group]
        if tag is None or (tags[group] != tag).any() or (np.diff(at) <= 0).any():
            return None
        values, position = payloads[tag]
        name = _COLUMN_OF[key]
        mask = np.ones(n, dtype=bool)
        mask[at] = False
        picked = position[group]
        if tag == _STRING:  # interned once per request
            interned = values.take(pa.array(picked)).dictionary_encode()
            indices = np.zeros(n, np.int32)
            indices[at] = interned.indices.to_numpy()
            column = pa.DictionaryArray.from_arrays(
                pa.array(indices, mask=mask), interned.dictionary
            )
        else:
            numbers = np.zeros(n, values.dtype)
            numbers[at] = values[picked]
            kind = otlp._KINDS[key]
            if tag == _INT and not kind.low <= numbers[at].min() <= numbers[at].max() <= kind.high:
                return None  # the span-by-span decoder names the value that does not fit
            column = pa.array(numbers, mask=mask)
        columns[name] = column.cast(schema.SPAN_SCHEMA.field(name).type)
    return columns


def _payloads(
    data: pa.Buffer, buf: np.ndarray, tags: np.ndarray, at: np.ndarray, ends: np.ndarray
) -> dict[int, tuple[Any, np.ndarray]] | None:
    """Every AnyValue's one value, decoded a type at once: by tag, the values (strings as one
    arrow array, numbers as numpy) and each KeyValue's position among them; None where an
    AnyValue is not one well-formed string, int or double."""
    decoded: dict[int, tuple[Any, np.ndarray]] = {}
    seen = np.zeros(len(tags), dtype=bool)
    for tag in (_STRING, _INT, _DOUBLE):
        chosen = tags == tag
        seen |= chosen
        where = np.flatnonzero(chosen)
        start, end = at[where], ends[where]
        values: Any
        if tag == _STRING:
            length, size = _lengths(buf, start)
            if (start + size + length != end).any():
                return None
            values = _strings(data, start + size, length)
            if values is None:
                return None
        elif tag == _INT:
            number, size = _varints(buf, start)
            if (start + size != end).any():
                return None
            values = number.view(np.int64)
        else:
            if (start + 8 != end).any():
                return None
            values = buf[start[:, None] + np.arange(8)].copy().view("<f8").ravel()
        decoded[tag] = values, np.cumsum(chosen) - 1
    return decoded if seen.all() else None


def _varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The base-128 varints at ``at`` (up to 10 bytes each, as uint64) and their sizes in
    bytes; a varint longer than 10 bytes reads as one that ends at the tenth (a later check
    then fails)."""
    byte = buf[at]
    value = (byte & 0x7F).astype(np.uint64)
    size = np.ones(len(at), np.int64)
    going = byte >= 0x80
    for shift in range(1, 10):
        if not going.any():  # most are one byte: one pass
            break
        more = np.flatnonzero(going)
        byte = buf[at[more] + shift]
        value[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * shift)
        size[more] += 1
        going[more] = byte >= 0x80
    return value, size


def _lengths(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint lengths at ``at`` as int64 (a huge one capped: it then fits nowhere)."""
    value, size = _varints(buf, at)
    return np.minimum(value, np.uint64(1 << 40)).astype(np.int64), size


def _strings(data: pa.Buffer, at: np.ndarray, length: np.ndarray) -> pa.Array | None:
    """The UTF-8 strings of ``length`` bytes at ``at`` in ``data`` (in order, apart), as one
    arrow array; None where one is not UTF-8 (OTLP's own parse then says why). No copy of the
    bytes: an array whose every other item is a string and the rest the gaps between them."""
    bounds = np.empty(2 * len(at) + 1, np.int64)
    bounds[0:-1:2] = at
    bounds[1::2] = at + length
    bounds[-1] = bounds[-2]
    if bounds[-1] > np.iinfo(np.int32).max:
        return None
    spaced = pa.Array.from_buffers(
        pa.binary(), 2 * len(at), [None, pa.py_buffer(bounds.astype(np.int32)), data]
    )
    try:
        return spaced.take(pa.array(np.arange(0, 2 * len(at), 2))).cast(pa.string())
    except pa.ArrowInvalid:
        return None
