"""OTLP requests of xsp's own spans -> span columns without a Python object per span.

``decode.table_from_resource_spans`` reads each span and attribute through protobuf's Python
objects (a Span, a KeyValue, its AnyValue, a ``WhichOneof``): about 0.7 µs an attribute, nine a
span, most of the collector's store worker's time. Here the request is parsed with a mirror of
OTLP's messages whose spans are ``repeated bytes`` (wire-compatible with ``repeated Span``), and
the spans of a request, then their attributes, links and statuses, are read from one buffer with
numpy (``protobuf_fields.scan``), the way capture's records are: every span at once, field by
field.

Only the common case is decoded so: spans of kind INTERNAL with status ERROR or UNSET (without a
message), no events, trace state, flags or dropped counts, links with ids only, and every
attribute one that a column holds, with its column's own value type (string, int or double) and
once per span. Any other request (another sender's, a viewer layout's) is parsed as OTLP and
decoded span by span (``decode_spans.any_columns``), into the same table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from xsp.core import schema
from xsp.core.otlp import mirror
from xsp.core.otlp import protobuf_fields as pf
from xsp.core.otlp.attributes import KINDS
from xsp.core.otlp.decode import Scopes, spans_and_scopes, table_from_columns
from xsp.core.otlp.decode_spans import any_columns
from xsp.core.otlp.protobuf_fields import FIXED32, FIXED64, LENGTH, VARINT
from xsp.core.otlp.wire import (
    INT64_MAX,
    ITERATION_ROOT_IDS,
    ROOT_KINDS,
    ROOT_NAMES,
    DecodeError,
)

__all__ = [
    "Block",
    "Decoder",
    "block",
    "common_columns",
    "finish_columns",
    "parse_request",
    "table_from_resource_spans",
    "tables_of_blocks",
]

_PACKAGE = "xsp.otlp_columns"
_F = descriptor_pb2.FieldDescriptorProto


def _build() -> Any:
    span = mirror.copy_message(trace_pb2.Span.DESCRIPTOR, _PACKAGE)
    for field_ in span.field:
        if field_.name == "attributes":  # each KeyValue as its encoded bytes
            field_.type = _F.TYPE_BYTES
            field_.ClearField("type_name")
    return mirror.request_class(_PACKAGE, span, raw_spans=True)


_Request = _build()


def parse_request(body: bytes) -> Any:
    """A protobuf request body as the mirror (its resources and scopes are OTLP's own)."""
    request = _Request()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise DecodeError(f"not an OTLP protobuf trace request: {exc}") from exc
    return request


def table_from_resource_spans(resource_spans: Any, sender: str | None = None) -> pa.Table:
    """``decode.table_from_resource_spans`` of a mirror's ResourceSpans: the same table."""
    spans, scopes = spans_and_scopes(resource_spans)
    columns = common_columns(spans)
    added: list[int] = []
    if columns is None:  # not xsp's common case: OTLP's own messages, span by span
        columns, added = any_columns([Span.FromString(s) for s in spans])
    return table_from_columns(columns, added, scopes, sender, len(spans))


class Block(NamedTuple):
    """One ResourceSpans of a mirror's request: its spans' bytes, scopes and sender."""

    spans: list[bytes]
    scopes: Scopes
    sender: str


def block(resource_spans: Any, sender: str) -> Block:
    return Block(*spans_and_scopes(resource_spans), sender)


#: A decoder of the common case: ``common_columns``'s arguments and answer.
Decoder = Callable[[list[bytes], np.ndarray | None], dict[str, pa.Array] | None]


def tables_of_blocks(
    blocks: list[Block], decode: Decoder | None = None, groups: list[int] | None = None
) -> list[pa.Table] | None:
    """The table of each block (as ``table_from_resource_spans`` makes it), or of each group
    of ``groups[k]`` consecutive blocks (one table for many senders' few spans each), all
    decoded in one go by ``decode`` (default ``common_columns``), so that numpy's and arrow's
    cost per call is paid once for many requests; None where a block is not xsp's common case
    (decode each alone then)."""
    lengths = np.array([len(b.spans) for b in blocks], np.int64)
    firsts = np.cumsum(lengths) - lengths
    n = int(lengths.sum())
    if not n:
        return None
    columns = (decode or common_columns)([span for b in blocks for span in b.spans], firsts)
    if columns is None:
        return None
    senders = list(dict.fromkeys(b.sender for b in blocks))
    code = {sender: k for k, sender in enumerate(senders)}
    indices = np.repeat(np.array([code[b.sender] for b in blocks], np.int32), lengths)
    columns["resource_id"] = pa.DictionaryArray.from_arrays(indices, senders).cast(
        schema.SPAN_SCHEMA.field("resource_id").type
    )
    scopes = [
        (first + int(at), scope)
        for b, at in zip(blocks, firsts.tolist(), strict=True)
        for first, scope in b.scopes
    ]
    table = table_from_columns(columns, [], scopes, None, n)
    bounds = np.concatenate([firsts, [n]])
    ends = np.cumsum([0, *(groups if groups is not None else [1] * len(blocks))])
    starts = bounds[ends].tolist()
    return [table.slice(a, b - a) for a, b in itertools.pairwise(starts)]


#: Span fields (their numbers in OTLP's Span): where xsp's common case has them.
_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT, _NAME, _KIND, _START, _END = 1, 2, 3, 4, 5, 6, 7, 8
_ATTRIBUTES, _EVENTS, _LINKS, _STATUS, _FLAGS = 9, 11, 13, 15, 16
_DROPPED_COUNTS = (10, 12, 14)
_KNOWN = {_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT, _NAME, _KIND, _START, _END, _ATTRIBUTES}
_KNOWN |= {_EVENTS, _LINKS, _STATUS, _FLAGS, *_DROPPED_COUNTS}
#: A Status's fields, a Link's ids.
_STATUS_MESSAGE, _STATUS_CODE = 2, 3
_LINK_TRACE_ID, _LINK_SPAN_ID = 1, 2


def common_columns(
    spans: list[bytes], firsts: np.ndarray | None = None
) -> dict[str, pa.Array] | None:
    """The columns of encoded spans in xsp's common case, every span at once; None where a
    span has anything else (or is malformed: protobuf's own parse then says how). ``firsts``:
    where each ResourceSpans' spans begin, when they come from several (a root's parent is
    looked for among its own ResourceSpans' spans)."""
    n = len(spans)
    if not n:
        return None
    data, buf, starts, ends = pf.data_buffer(spans)
    fields = pf.scan(buf, starts, ends)
    if fields is None or not np.isin(fields.number, list(_KNOWN)).all():
        return None
    if (fields.number == _EVENTS).any() or (fields.number == _TRACE_STATE).any():
        return None  # (an empty trace state is not written by any encoder xsp knows)
    for number in (*_DROPPED_COUNTS, _KIND):
        if fields.one(number, VARINT, n) is None:
            return None
    flags = fields.every(_FLAGS, FIXED32)
    if flags is None or pf.gather(buf, fields.at[flags], 4).any():
        return None
    if fields.value[np.isin(fields.number, _DROPPED_COUNTS)].any():
        return None
    if not _all_internal(fields, buf, n):
        return None
    ids = _fixed_ids(fields, buf, n)
    times = _times(fields, buf, n)
    messages = _statuses(fields, buf, n)
    links = _links(fields, buf, n)
    attributes = _attribute_columns(fields, data, buf, n)
    name = fields.one(_NAME, LENGTH, n)
    if ids is None or times is None or messages is None or links is None or name is None:
        return None
    if attributes is None:
        return None
    names = pf.strings(
        data,
        np.where(name >= 0, fields.at[name], starts),  # absent: "" where the span starts
        np.where(name >= 0, fields.size[name], 0),
    )
    if names is None:
        return None
    trace_ids, span_ids, parent_ids = ids
    start_ns, end_ns = times
    columns: dict[str, pa.Array] = {
        "trace_id": trace_ids,
        "span_id": pa.array(span_ids),
        "start_ns": pa.array(start_ns),
        "dur_ns": pa.array(np.maximum(end_ns - start_ns, 0)),
        "status_message": messages,
        "link_trace_id": links[0],
        "link_span_id": links[1],
        **attributes,
    }
    return finish_columns(columns, names, span_ids, parent_ids, firsts)


def finish_columns(
    columns: dict[str, pa.Array],
    names: pa.Array,
    span_ids: np.ndarray,
    parent_ids: np.ndarray,
    firsts: np.ndarray | None,
) -> dict[str, pa.Array]:
    """The common case's columns completed from the decoded ones (any decoder's: this one's, or
    the collector's native one): the names, parents and remote parents, with the steps' and
    iterations' roots as ``_any_columns`` makes them. ``parent_ids`` is changed in place."""
    firsts = np.zeros(1, np.int64) if firsts is None else firsts
    remote, names = _roots(columns, names, span_ids, parent_ids, firsts)
    columns["name"] = names.dictionary_encode().cast(schema.SPAN_SCHEMA.field("name").type)
    columns["remote_parent_span_id"] = remote
    columns["parent_span_id"] = pa.array(parent_ids)
    return columns


def _all_internal(fields: pf.Fields, buf: np.ndarray, n: int) -> bool:
    kinds = fields.varints(_KIND, n)
    return kinds is not None and bool((kinds == Span.SPAN_KIND_INTERNAL).all())


def _fixed_ids(
    fields: pf.Fields, buf: np.ndarray, n: int
) -> tuple[pa.Array, np.ndarray, np.ndarray] | None:
    """trace_id (16 bytes each), span_id and parent_span_id (8 bytes, or none: 0) as numbers."""
    trace, span = fields.one(_TRACE_ID, LENGTH, n), fields.one(_SPAN_ID, LENGTH, n)
    parent = fields.one(_PARENT, LENGTH, n)
    if trace is None or span is None or parent is None:
        return None
    if (trace < 0).any() or (span < 0).any() or (fields.size[trace] != 16).any():
        return None
    if (fields.size[span] != 8).any():
        return None
    has_parent = parent >= 0
    parent_size = fields.size[parent[has_parent]]
    if not np.isin(parent_size, (0, 8)).all():
        return None
    trace_ids = pa.Array.from_buffers(
        pa.binary(16), n, [None, pa.py_buffer(pf.gather(buf, fields.at[trace], 16))]
    )
    span_ids = pf.gather(buf, fields.at[span], 8).view(">u8").ravel().astype(np.uint64)
    parent_ids = np.zeros(n, np.uint64)
    eight = np.flatnonzero(has_parent)[parent_size == 8]
    parent_ids[eight] = pf.gather(buf, fields.at[parent[eight]], 8).view(">u8").ravel()
    return trace_ids, span_ids, parent_ids


def _times(fields: pf.Fields, buf: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """start and end in ns (0 where absent); None past int64."""
    out = []
    for number in (_START, _END):
        which = fields.one(number, FIXED64, n)
        if which is None:
            return None
        values = np.zeros(n, np.uint64)
        present = np.flatnonzero(which >= 0)
        values[present] = pf.gather(buf, fields.at[which[present]], 8).view("<u8").ravel()
        if len(values) and int(values.max()) > INT64_MAX:
            return None
        out.append(values.astype(np.int64))
    return out[0], out[1]


def _submessages(
    fields: pf.Fields, buf: np.ndarray, n: int, number: int, allowed: tuple[int, ...]
) -> tuple[np.ndarray, pf.Fields] | None:
    """The spans that have field ``number`` (at most once each), and that field's own fields;
    None where a span repeats it or it holds a field outside ``allowed``."""
    which = fields.one(number, LENGTH, n)
    if which is None:
        return None
    rows = np.flatnonzero(which >= 0)
    at = fields.at[which[rows]]
    inner = pf.scan(buf, at, at + fields.size[which[rows]])
    if inner is None or not np.isin(inner.number, allowed).all():
        return None
    return rows, inner


def _statuses(fields: pf.Fields, buf: np.ndarray, n: int) -> pa.Array | None:
    """``status_message``: the message of each span whose status is ERROR (null elsewhere);
    None where a status has another code or field."""
    found = _submessages(fields, buf, n, _STATUS, (_STATUS_MESSAGE, _STATUS_CODE))
    if found is None:
        return None
    rows, status = found
    codes = status.varints(_STATUS_CODE, len(rows))
    message = status.one(_STATUS_MESSAGE, LENGTH, len(rows))
    if codes is None or message is None:
        return None
    if not np.isin(codes, (Status.STATUS_CODE_UNSET, Status.STATUS_CODE_ERROR)).all():
        return None
    unset_with_text = (codes == Status.STATUS_CODE_UNSET) & (message >= 0)
    if (status.size[message[unset_with_text]] > 0).any():
        return None  # an UNSET status with a message: ``status_description``, span by span
    messages: list[str | None] = [None] * n
    for row, field_ in zip(
        rows[codes == Status.STATUS_CODE_ERROR].tolist(),
        message[codes == Status.STATUS_CODE_ERROR].tolist(),
        strict=True,
    ):  # few: the spans that failed
        text = (
            b"" if field_ < 0 else buf[status.at[field_] : status.at[field_] + status.size[field_]]
        )
        try:
            messages[row] = bytes(text).decode()
        except UnicodeDecodeError:
            return None
    return pa.array(messages, pa.string())


def _links(fields: pf.Fields, buf: np.ndarray, n: int) -> tuple[pa.Array, pa.Array] | None:
    """``link_trace_id`` and ``link_span_id``; None where a span's link says more than its
    ids or it has several (``decode_spans.link_rows``)."""
    found = _submessages(fields, buf, n, _LINKS, (_LINK_TRACE_ID, _LINK_SPAN_ID))
    if found is None:
        return None
    rows, link = found
    trace, span = (
        link.one(_LINK_TRACE_ID, LENGTH, len(rows)),
        link.one(_LINK_SPAN_ID, LENGTH, len(rows)),
    )
    if trace is None or span is None or (trace < 0).any() or (span < 0).any():
        return None
    if (link.size[trace] != 16).any() or (link.size[span] != 8).any():
        return None
    missing = np.ones(n, dtype=bool)
    missing[rows] = False
    traces = np.zeros((n, 16), np.uint8)
    traces[rows] = pf.gather(buf, link.at[trace], 16)
    span_ids = np.zeros(n, np.uint64)
    span_ids[rows] = pf.gather(buf, link.at[span], 8).view(">u8").ravel()
    valid = pa.array(~missing).buffers()[1] if len(rows) < n else None
    return (
        pa.Array.from_buffers(pa.binary(16), n, [valid, pa.py_buffer(traces)]),
        pa.array(span_ids, mask=missing),
    )


def _roots(
    columns: dict[str, pa.Array],
    names: pa.Array,
    span_ids: np.ndarray,
    parent_ids: np.ndarray,
    firsts: np.ndarray,
) -> tuple[pa.Array, pa.Array]:
    """As ``_any_columns`` does, for the few steps and iterations: an application's span above
    one moved out of ``parent_ids`` into the ``remote_parent_span_id`` returned, a root's wire
    title back to its plain name."""
    n = len(parent_ids)
    kinds = columns["kind"].dictionary_decode() if "kind" in columns else pa.nulls(n, pa.string())
    roots = np.flatnonzero(pc.fill_null(pc.is_in(kinds, pa.array(ROOT_KINDS)), False))
    remote = np.zeros(n, np.uint64)
    is_remote = np.zeros(n, dtype=bool)
    if not len(roots):
        return pa.array(remote, mask=~is_remote), names
    traces = columns["trace_id"]
    root_kinds = kinds.take(pa.array(roots)).to_pylist()
    renamed = np.zeros(n, dtype=bool)
    titles: list[str] = []
    for row, kind in zip(roots.tolist(), root_kinds, strict=True):
        parent = int(parent_ids[row])
        if parent > ITERATION_ROOT_IDS:
            block = int(np.searchsorted(firsts, row, side="right")) - 1
            lo = int(firsts[block])
            hi = int(firsts[block + 1]) if block + 1 < len(firsts) else n
            # the parent, if it is among its ResourceSpans' spans
            same = lo + np.flatnonzero(span_ids[lo:hi] == np.uint64(parent))
            trace = traces[row]
            if not any(traces[other] == trace for other in same.tolist()):
                remote[row], is_remote[row] = parent, True
                parent_ids[row] = parent = 0
        if not parent:
            renamed[row] = True
            titles.append(ROOT_NAMES[kind])
    if renamed.any():
        names = pc.replace_with_mask(names, pa.array(renamed), pa.array(titles, pa.string()))
    return pa.array(remote, mask=~is_remote), names


#: The AnyValue field (its tag byte) of each attribute column's own values: string = 1,
#: int = 3 (varint), double = 4 (64-bit).
_STRING, _INT, _DOUBLE = 0x0A, 0x18, 0x21
_TAG_OF = {
    key: _DOUBLE if kind.is_float else _STRING if kind.high is None else _INT
    for key, kind in KINDS.items()
}
_COLUMN_OF = {str(c.attribute): c.name for c in schema.ATTRIBUTE_COLUMNS}


def _attribute_columns(
    fields: pf.Fields, data: pa.Buffer, buf: np.ndarray, n: int
) -> dict[str, pa.Array] | None:
    """The attribute columns from the spans' encoded KeyValues: ``key`` (field 1) then
    ``value`` (field 2, an AnyValue of one field), all decoded at once; None where one is laid
    out otherwise, names no column, has another value type than its column's or comes twice in
    a span."""
    picked = fields.every(_ATTRIBUTES, LENGTH)
    if picked is None:
        return None
    if not len(picked):
        return {}
    rows = fields.message[picked]
    starts = fields.at[picked]
    ends = starts + fields.size[picked]
    if (fields.size[picked] < 5).any() or (buf[starts] != 0x0A).any():
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
    keys = pf.strings(data, key_at, key_len)
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
            kind = KINDS[key]
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
            values = pf.strings(data, start + size, length)
            if values is None:
                return None
        elif tag == _INT:
            number, size = pf.varints(buf, start)
            if (start + size != end).any():
                return None
            values = number.view(np.int64)
        else:
            if (start + 8 != end).any():
                return None
            values = buf[start[:, None] + np.arange(8)].copy().view("<f8").ravel()
        decoded[tag] = values, np.cumsum(chosen) - 1
    return decoded if seen.all() else None


def _lengths(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint lengths at ``at`` as int64 (a huge one capped: it then fits nowhere)."""
    value, size = pf.varints(buf, at)
    return np.minimum(value, np.uint64(1 << 40)).astype(np.int64), size
