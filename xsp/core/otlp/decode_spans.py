"""Any OTLP request -> span columns, span by span through protobuf's objects: another sender's
spans, a viewer layout's (undone here), or xsp's own that the column-wise decoder (``columns``)
does not take. Every field beyond xsp's (``schema.OTLP_COLUMNS``) goes into its column; an
attribute under an xsp key of another type than its column's is kept as it came too."""

from __future__ import annotations

from typing import Any, NamedTuple

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from xsp.core import schema
from xsp.core.otlp import json_values
from xsp.core.otlp.attributes import (
    KINDS,
    ColumnKind,
    plain_value,
    stored_parent,
    typed_value,
)
from xsp.core.otlp.stored import StoredEvent, StoredLink
from xsp.core.otlp.wire import (
    DROPPED,
    ITERATION_ROOT_IDS,
    ROOT_KINDS,
    ROOT_NAMES,
    VIEW_KEYS,
)

__all__ = ["any_columns", "link_rows"]

_ERROR, _UNSET, _INTERNAL = (
    Status.STATUS_CODE_ERROR,
    Status.STATUS_CODE_UNSET,
    Span.SPAN_KIND_INTERNAL,
)


class _Undone(NamedTuple):
    """The columns a viewer layout changed, which its attributes put back: names, parents, and
    the rows it added (not stored)."""

    names: list[str]
    parents: list[int]
    added: list[int]


def any_columns(spans: list[Span]) -> tuple[dict[str, list[Any]], list[int]]:
    """Any request's columns, span by span, and the rows a viewer layout added
    (``xsp.tracer.export.view``: not stored). Tight loop: each protobuf field access costs, so
    touch each once."""
    n = len(spans)
    slots: dict[str, tuple[list[Any], ColumnKind]] = {}
    for column in schema.ATTRIBUTE_COLUMNS:
        assert column.attribute is not None
        slots[column.attribute] = ([None] * n, KINDS[column.attribute])
    trace_ids, span_ids, starts, durs = [], [], [], []
    names: list[str] = []
    parents: list[int] = []
    statuses: list[str | None] = []
    link_traces: list[bytes | None] = [None] * n
    link_spans: list[int | None] = [None] * n
    undone = _Undone(names, parents, [])
    rest = _Rest(n)
    taken_in: dict[str, int] = {}  # each column's (or view's) key: the last row that set it
    for row, span in enumerate(spans):
        trace_ids.append(span.trace_id)
        span_ids.append(int.from_bytes(span.span_id, "big"))
        parents.append(int.from_bytes(span.parent_span_id, "big"))
        names.append(span.name)
        start = span.start_time_unix_nano
        starts.append(start)
        durs.append(max(0, span.end_time_unix_nano - start))
        statuses.append(_error_message(span.status, row, rest))
        link = _fields_beyond_xsps(span, row, rest)
        if link is not None:
            link_traces[row], link_spans[row] = link
        others = _column_attributes(span.attributes, row, slots, taken_in, undone)
        if others:
            rest.set("attributes", row, json_values.attributes_text(others))
    # after the view's stored parents are back: an application's span above a model span
    kinds = slots[schema.ATTR_KIND][0]
    remote = _remote_parents(trace_ids, span_ids, parents, kinds)
    columns: dict[str, list[Any]] = {
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
        if kind in ROOT_NAMES and not parents[row]:
            names[row] = ROOT_NAMES[kind]
    return columns, undone.added


def _error_message(status: Status, row: int, rest: _Rest) -> str | None:
    """An error's message (``status_message``); another status's code and message go in
    ``rest``, as an error's message alone would not say them."""
    code = status.code
    if code == _ERROR:
        return status.message
    if code != _UNSET:
        rest.set("status_code", row, code)  # OK: status_message cannot say it
    if status.message:  # not an error's: not a failure to the analyses
        rest.set("status_description", row, status.message)
    return None


def _fields_beyond_xsps(span: Span, row: int, rest: _Rest) -> tuple[bytes, int] | None:
    """Put a span's kind, links, events, trace state, flags and dropped counts in ``rest``
    (those set); return its first link's ids (``link_trace_id``, ``link_span_id``)."""
    if span.kind != _INTERNAL:
        rest.set("span_kind", row, span.kind)
    first = None
    links = span.links
    if links:
        first = links[0].trace_id, int.from_bytes(links[0].span_id, "big")
        listed = link_rows(links)
        if listed is not None:
            rest.set("links", row, listed)
    if span.events:
        rest.set("events", row, _event_rows(span.events))
    if span.trace_state:
        rest.set("trace_state", row, span.trace_state)
    if span.flags:
        rest.set("flags", row, span.flags)
    for field_ in DROPPED:
        count = getattr(span, field_)
        if count:
            rest.set(field_, row, count)
    return first


def _column_attributes(
    attributes: Any,
    row: int,
    slots: dict[str, tuple[list[Any], ColumnKind]],
    taken_in: dict[str, int],
    undone: _Undone,
) -> list[KeyValue] | None:
    """Put a span's attributes in their columns (``slots``) and undo a viewer layout's; return
    the others, in the order they came (None: none)."""
    others = None
    # From the last: a column's (or the view's) key that came again later is skipped, so the
    # last value wins, as in a dict, in OTLP/JSON parsers and in the door's check (a map)
    for kv in reversed(attributes):
        key = kv.key
        slot = slots.get(key)
        if slot is not None or key in VIEW_KEYS:
            if taken_in.get(key) == row:
                continue
            taken_in[key] = row
        if slot is not None:
            value, kind = kv.value, slot[1]
            which = value.WhichOneof("value")
            slot[0][row] = typed_value(value, kind, which)
            if which != kind.own:
                # another sender's type under an xsp key: the column holds it converted,
                # the encoders give back the value as it came (``rows.given_back``)
                if others is None:
                    others = []
                others.append(kv)
        elif key in VIEW_KEYS:
            _undo_view(kv, row, undone)
        else:
            if others is None:
                others = []
            others.append(kv)
    if others:
        others.reverse()  # in the order they came
    return others


def _undo_view(kv: KeyValue, row: int, undone: _Undone) -> None:
    """Put back what the viewer layout changed on span ``row``: its full kernel name, its stored
    parent, or leave out a span it added."""
    value = plain_value(kv.value)
    if kv.key == schema.ATTR_KERNEL_NAME and isinstance(value, str) and value:
        undone.names[row] = value
    elif kv.key == schema.ATTR_VIEW_ADDED and value is True:
        undone.added.append(row)
    elif kv.key == schema.ATTR_VIEW_STORED_PARENT:
        undone.parents[row] = stored_parent(kv.value)


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
            parent > ITERATION_ROOT_IDS
            and kinds[row] in ROOT_KINDS
            and (trace_ids[row], parent) not in known
        ):
            remote[row], parents[row] = parent, 0
    return remote


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


def _event_rows(events: Any) -> list[StoredEvent]:
    return [
        {
            "time_ns": event.time_unix_nano,
            "name": event.name,
            "attributes": json_values.attributes_text(event.attributes),
            "dropped_attributes_count": event.dropped_attributes_count or None,
        }
        for event in events
    ]


def link_rows(links: Any) -> list[StoredLink] | None:
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
            "attributes": json_values.attributes_text(link.attributes),
            "dropped_attributes_count": link.dropped_attributes_count or None,
        }
        for link in links
    ]
