"""A span table's rows as the wire has them, read once for both encoders (protobuf: ``encode``,
OTLP/JSON: ``encode_json``): ids, names, times, the set attributes, the fields beyond xsp's
(``schema.OTLP_COLUMNS``) and the instrumentation scopes. How rows are dressed for the wire (a
root's title, a kernel's short name, a resource's added keys) is the caller's ``WireLayout``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias, cast

import pyarrow as pa
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from xsp.core import schema
from xsp.core.otlp.json_types import AttributeValue, KeyValueJson
from xsp.core.otlp.stored import RestRow
from xsp.core.otlp.wire import ROOT_KINDS, SCOPE_NAME

__all__ = [
    "PLAIN",
    "ScopeKey",
    "SpanRow",
    "WireLayout",
    "given_back",
    "rest_rows",
    "scope_groups",
    "span_links",
    "span_rows",
    "status_of",
]


@dataclass(frozen=True)
class WireLayout:
    """How the encoders dress rows and resources for the wire (``layout`` builds xsp's): the
    resource as sent, a trace root's name (None: the stored one), a kernel's shown name (None:
    the stored one; else the full name goes in ``schema.ATTR_KERNEL_NAME``) and the table
    columns sent as attributes beside ``schema.ATTRIBUTE_COLUMNS`` (column, attribute key)."""

    resource: Callable[[Mapping[str, AttributeValue]], dict[str, AttributeValue]] = dict
    root_name: Callable[[Mapping[str, AttributeValue], int | None], str] | None = None
    kernel_name: Callable[[str], str] | None = None
    attribute_columns: tuple[tuple[str, str], ...] = ()


#: Rows as stored, the resource as given.
PLAIN = WireLayout()


class SpanRow(NamedTuple):
    """A span as the wire has it (parent 0: none; message: an error's)."""

    trace_id: bytes
    span_id: int
    parent: int
    name: str
    start: int
    end: int
    attributes: list[tuple[str, AttributeValue]]
    message: str | None


def span_rows(
    resource: Mapping[str, AttributeValue], table: pa.Table, layout: WireLayout = PLAIN
) -> Iterator[SpanRow]:
    """Each row of ``table`` as the wire has it: trace id, span id, parent id (0: none; an
    application's span above a model span), name (as ``layout`` names roots and kernels), start
    and end ns, the set attributes and the error message. Both encoders (protobuf and OTLP/JSON)
    read spans through it."""
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
    attribute_columns += [
        (cols[name], key) for name, key in layout.attribute_columns if name in cols
    ]
    root_name, kernel_name = layout.root_name, layout.kernel_name
    for row in range(n):
        start, parent, name = cols["start_ns"][row], cols["parent_span_id"][row], cols["name"][row]
        attributes = [
            (key, values[row]) for values, key in attribute_columns if values[row] is not None
        ]
        if kinds[row] in ROOT_KINDS and not parent:
            if root_name is not None:
                name = root_name(resource, iterations[row])
        elif kernel_name is not None and kinds[row] == schema.KIND_KERNEL and name:
            short = kernel_name(name)
            if short != name:
                attributes.append((schema.ATTR_KERNEL_NAME, name))
                name = short
        yield SpanRow(
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


def rest_rows(table: pa.Table) -> list[RestRow | None]:
    """Each row's OTLP fields beyond xsp's (``schema.OTLP_COLUMNS``, those set), None where it
    has none (every xsp span): both encoders give them back."""
    n = table.num_rows
    # filled by column name, so untyped until returned
    rows: list[dict[str, object] | None] = [None] * n
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
    return cast(list[RestRow | None], rows)


#: The columns that group a resource's spans into scopes (ScopeSpans), not fields of a span.
_SCOPE_COLUMNS = ("scope_name", "scope_version", "scope_extra", "resource_id")


#: A scope as stored: name, version and the rest as OTLP/JSON text (``ScopeExtraJson``; None
#: where it has none).
ScopeKey: TypeAlias = tuple[str, str, str | None]


def scope_groups(table: pa.Table, scope_version: str) -> list[tuple[ScopeKey, list[int]]]:
    """The rows of each instrumentation scope, scopes in the order of their first row: a
    stored scope (name, version, the rest as OTLP/JSON text), or xsp's own where none is."""
    n = table.num_rows
    ours: ScopeKey = (SCOPE_NAME, scope_version, None)
    if "scope_name" not in table.column_names or table.column("scope_name").null_count == n:
        return [(ours, list(range(n)))]
    names = table.column("scope_name").to_pylist()
    versions = table.column("scope_version").to_pylist()
    extras = table.column("scope_extra").to_pylist()
    groups: dict[ScopeKey, list[int]] = {}
    for row, name in enumerate(names):
        key = ours if name is None else (name, versions[row] or "", extras[row])
        groups.setdefault(key, []).append(row)
    return list(groups.items())


def status_of(message: str | None, rest: RestRow | None) -> tuple[Status.StatusCode.ValueType, str]:
    """The OTLP status code and message of a row: an
    error's message is ``status_message``, another status's ``status_description``."""
    stored: RestRow = rest or {}
    code = stored.get("status_code")
    if code is None:
        code = Status.STATUS_CODE_ERROR if message is not None else Status.STATUS_CODE_UNSET
    return Status.StatusCode.ValueType(code), message or stored.get("status_description") or ""


def given_back(
    attributes: list[tuple[str, AttributeValue]], kept: Sequence[KeyValueJson]
) -> list[tuple[str, AttributeValue]]:
    """A row's column attributes less those its kept attributes (OTLP/JSON) give back as they
    came: another sender's value of another type under an xsp key, which its column holds
    converted (``decode_spans.any_columns``)."""
    keys = {item.get("key") for item in kept}
    return [(key, value) for key, value in attributes if key not in keys]


def span_links(table: pa.Table) -> list[tuple[bytes, int] | None]:
    """Each row's OpenTelemetry span link (trace id, span id), None where it has none."""
    if "link_span_id" not in table.column_names or "link_trace_id" not in table.column_names:
        return [None] * table.num_rows
    traces = table.column("link_trace_id").to_pylist()
    spans = table.column("link_span_id").to_pylist()
    return [(t, s) if t and s else None for t, s in zip(traces, spans, strict=True)]
