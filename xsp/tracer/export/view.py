"""The layout of a trace for a trace viewer (Jaeger): what the OTLP sinks send and the file export
writes, on top of the stored spans, which stay as they are.

- **One service per level** (``<service>.model``, ``.framework``, ``.library``, ``.gpu``, as XSP
  gave each level its own tracer): ``otlp.encode_request(..., view=True)`` puts each level's spans
  in a ResourceSpans of their own (``level_resource``).
- **Short kernel names** (``xsp.tracer.export.kernel_names``), the full name kept in
  ``schema.ATTR_KERNEL_NAME``; also done by the encoder.
- **Backward under its layer** (``with_backward_layers``, here): autograd runs a layer's backward
  nodes at the root of the step, so its kernels have no layer above them. Each run of
  consecutive backward nodes of one layer gets a span "<layer> (backward)" (kind module, phase
  backward) over them, nested like the forward layers ("layer1 (backward)" > "layer1.0
  (backward)" > "layer1.0.conv1 (backward)"), and the nodes move under it.

Every change is undone by the decoder (``otlp.table_from_resource_spans``), so the xsp collector
stores what the tracer stored: the added spans carry ``schema.ATTR_VIEW_ADDED`` and are dropped,
a moved node carries its stored parent in ``schema.ATTR_VIEW_STORED_PARENT``, a shortened kernel
its name in ``schema.ATTR_KERNEL_NAME``, and a level's resource the run's own service name in
``schema.RES_SERVICE_BASE``.

Algorithm (``with_backward_layers``), per trace, parent and thread:
1. The backward nodes that carry a layer (``module_path``) and whose parent is no backward node
   are taken in start order.
2. A stack holds the open layer spans. For each node, the open spans whose path is not a prefix
   of the node's layer close; spans open for the missing prefixes (outermost first), under the
   innermost open one, or under the nodes' own parent. A node without a layer leaves the stack
   as it is: it stays where it was stored (``AccumulateGrad`` runs between a layer's nodes).
3. Each layer span lasts from its first node's start to its last node's end; its id is a hash of
   the trace, its parent, its path and its first node's id, so two exports agree and batches
   of one trace never make the same id twice.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.tracer import schema

#: Columns that exist only on the way to a viewer: the encoder turns them into the attributes
#: ``schema.ATTR_VIEW_ADDED`` and ``schema.ATTR_VIEW_STORED_PARENT``.
ADDED_COLUMN = "view_added"
STORED_PARENT_COLUMN = "view_stored_parent"
WIRE_COLUMNS = (
    (ADDED_COLUMN, schema.ATTR_VIEW_ADDED),
    (STORED_PARENT_COLUMN, schema.ATTR_VIEW_STORED_PARENT),
)
BACKWARD_SUFFIX = " (backward)"
_NODE_COLUMNS = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "start_ns",
    "dur_ns",
    "module_path",
    "thread_id",
    "iteration",
    "rank",
]


def level_resource(resource: Mapping[str, Any], level: str | None) -> dict[str, Any]:
    """The resource of one level's spans: service ``<service>.<level>``, the run's own service
    name kept in ``schema.RES_SERVICE_BASE``. Spans without a level keep the run's resource."""
    wired = dict(resource)
    if level:
        base = str(wired.get(schema.RES_SERVICE_NAME) or schema.SERVICE_NAME)
        wired[schema.RES_SERVICE_NAME] = f"{base}.{level}"
        wired[schema.RES_SERVICE_BASE] = base
    return wired


def with_backward_layers(table: pa.Table) -> pa.Table:
    """``table`` with the layer spans of its backward (see the module notes), plus the view's
    columns (``WIRE_COLUMNS``); the stored rows keep their order, the added spans follow."""
    table = _with_wire_columns(table)
    needed = {"kind", "module_path", *_NODE_COLUMNS}
    if not table.num_rows or not needed <= set(table.column_names):
        return table
    kind = table.column("kind").cast(pa.string())
    rows = np.flatnonzero(pc.fill_null(pc.equal(kind, schema.KIND_BACKWARD), False))
    if not len(rows):
        return table
    nodes = table.select(_NODE_COLUMNS).take(pa.array(rows, pa.int64())).to_pylist()
    backward_ids = {(n["trace_id"], n["span_id"]) for n in nodes}
    groups: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for row, node in zip(rows, nodes, strict=True):
        if node["module_path"] and (node["trace_id"], node["parent_span_id"]) not in backward_ids:
            key = (node["trace_id"], node["parent_span_id"], node["thread_id"])
            groups[key].append((int(row), node))
    if not groups:
        return table
    types = _module_types(table)
    added: list[dict[str, Any]] = []
    moved: dict[int, int] = {}  # row -> its layer span's id
    for members in groups.values():
        members.sort(key=lambda member: member[1]["start_ns"])
        _lay_out(members, types, added, moved)
    parents = table.column("parent_span_id").to_numpy(zero_copy_only=False).copy()
    stored: list[str | None] = [None] * table.num_rows
    for moved_row, layer_id in moved.items():
        stored[moved_row] = f"{int(parents[moved_row]):016x}"
        parents[moved_row] = layer_id
    table = _replace(table, "parent_span_id", pa.array(parents, pa.uint64()))
    table = _replace(table, STORED_PARENT_COLUMN, pa.array(stored, pa.string()))
    extra = pa.Table.from_pylist(added, schema=table.schema)
    return pa.concat_tables([table, extra])


def _lay_out(
    members: list[tuple[int, dict[str, Any]]],
    types: Mapping[str, str],
    added: list[dict[str, Any]],
    moved: dict[int, int],
) -> None:
    """Steps 2 and 3 of the module notes for one group's nodes, in start order."""
    first = members[0][1]
    trace_id, root_parent = first["trace_id"], first["parent_span_id"]
    stack: list[dict[str, Any]] = []
    for row, node in members:
        path = node["module_path"]
        while stack and not _within(path, stack[-1]["module_path"]):
            stack.pop()
        prefixes = _prefixes(path)
        for prefix in prefixes[len(stack) :]:
            span = _layer_span(
                trace_id,
                stack[-1]["span_id"] if stack else root_parent,
                prefix,
                types.get(prefix),
                node,
            )
            added.append(span)
            stack.append(span)
        end = node["start_ns"] + node["dur_ns"]
        for span in stack:
            span["dur_ns"] = max(span["dur_ns"], end - span["start_ns"])
        moved[row] = stack[-1]["span_id"]


def _within(path: str, layer: str) -> bool:
    return path == layer or path.startswith(layer + ".")


def _prefixes(path: str) -> list[str]:
    """``"layer1.0.conv1"`` -> ``["layer1", "layer1.0", "layer1.0.conv1"]``."""
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _layer_span(
    trace_id: bytes,
    parent: int,
    path: str,
    module_type: str | None,
    node: Mapping[str, Any],
) -> dict[str, Any]:
    """A layer's backward span, opened at ``node``, its first."""
    seed = b"%s/%d/%s/%d" % (trace_id, parent, path.encode(), node["span_id"])
    span_id = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") or 1
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": path + BACKWARD_SUFFIX,
        "start_ns": node["start_ns"],
        "dur_ns": node["dur_ns"],
        "level": schema.LEVEL_FRAMEWORK,
        "iteration": node["iteration"],
        "rank": node["rank"],
        "kind": schema.KIND_MODULE,
        "phase": schema.PHASE_BACKWARD,
        "thread_id": node["thread_id"],
        "module_path": path,
        "module_type": module_type,
        ADDED_COLUMN: True,
    }


def _module_types(table: pa.Table) -> dict[str, str]:
    """Layer path -> module type, from the forward module spans."""
    if "module_type" not in table.column_names:
        return {}
    modules = table.filter(
        pc.fill_null(pc.equal(table.column("kind").cast(pa.string()), schema.KIND_MODULE), False)
    ).select(["module_path", "module_type"])
    return {
        str(path): str(type_)
        for path, type_ in zip(
            modules.column("module_path").to_pylist(),
            modules.column("module_type").to_pylist(),
            strict=True,
        )
        if path and type_
    }


def _with_wire_columns(table: pa.Table) -> pa.Table:
    if ADDED_COLUMN not in table.column_names:
        table = table.append_column(ADDED_COLUMN, pa.nulls(table.num_rows, pa.bool_()))
    if STORED_PARENT_COLUMN not in table.column_names:
        table = table.append_column(STORED_PARENT_COLUMN, pa.nulls(table.num_rows, pa.string()))
    return table


def _replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)
