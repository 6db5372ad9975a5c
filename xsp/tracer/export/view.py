"""The layout of a trace for a trace viewer (Jaeger): what the OTLP sinks send and the file export
writes, on top of the stored spans, which stay as they are.

- **One service per level** (``<service>.model``, ``.framework``, ``.library``, ``.gpu``, as XSP
  gave each level its own tracer): ``otlp_layout.encode_request(..., view=True)`` puts each level's spans
  in a ResourceSpans of their own (``level_resource``).
- **Short kernel names** (``xsp.tracer.export.kernel_names``), the full name kept in
  ``schema.ATTR_KERNEL_NAME``; also done by the encoder.
- **Backward under its layer** (``with_backward_layers``, here): autograd runs a layer's backward
  nodes at the root of the step, so its kernels have no layer above them. Each run of
  consecutive backward nodes of one layer gets a span "<layer> (backward)" (kind module, phase
  backward) over them, nested like the forward layers ("layer1 (backward)" > "layer1.0
  (backward)" > "layer1.0.conv1 (backward)"), and the nodes move under it.
- **Gradient accumulation folded** (``with_gradient_accumulation``, here): autograd's leaf nodes
  (``AccumulateGrad``, one a parameter: 161 of the 180 rows under a ResNet-50 training step)
  run between the layers' nodes at the root of the step and belong to no layer. Those of one
  parent and thread move under one span "gradient accumulation" (kind backward) lasting from
  the first one's start to the last one's end.

- **Large traces folded** (``fold``, here): a trace of more than ``max_spans_per_trace`` spans
  (default ``DEFAULT_MAX_SPANS_PER_TRACE``) keeps its model and framework spans (the step,
  layers, ops, backward nodes) and folds its library and GPU spans (API calls, library calls,
  kernels, copies) into one added summary span per op, whose attributes hold what was folded
  (``FOLD_KEYS``). Traces within the budget are sent exactly as without it.

Every change is undone by the decoder (``otlp.table_from_resource_spans``), so the xsp collector
stores what the tracer stored: the added spans carry ``schema.ATTR_VIEW_ADDED`` and are dropped,
a folded trace's summaries too (its folded spans are not sent: push ``--as-stored`` or
``--max-spans-per-trace 0`` sends all), a moved node carries its stored parent in ``schema.ATTR_VIEW_STORED_PARENT``, a shortened kernel
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

Algorithm (``fold``), per trace over the budget, on the laid-out tree (backward layers added):
1. A span is kept when it is no library or GPU span, its depth is at most D and its parent is
   kept (or not in the trace). D is the deepest that fits: kept spans plus one summary per kept
   span with folded spans below it within the budget (unlimited where the framework spans fit:
   every op keeps its span; found by bisection, as the count never falls as D deepens).
2. Every other span is folded into its nearest kept ancestor: that ancestor gets one child span
   "folded: N kernels · M API calls" (``schema.ATTR_VIEW_ADDED``) lasting from the first folded
   span's start to the last one's end, with the counts, the GPU time and the top kernels by time
   under their full names (``FOLD_KEYS``). Its id is a hash of the trace and the ancestor's id.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Final, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema
from xsp.core.otlp.json_types import AttributeValue

__all__ = [
    "ADDED_COLUMN",
    "BACKWARD_SUFFIX",
    "DEFAULT_MAX_SPANS_PER_TRACE",
    "FOLD_KEYS",
    "GRADIENT_ACCUMULATION",
    "STORED_PARENT_COLUMN",
    "TOP_KERNELS",
    "WIRE_COLUMNS",
    "fold",
    "for_viewer",
    "level_resource",
    "with_backward_layers",
    "with_gradient_accumulation",
]

#: Columns that exist only on the way to a viewer: the encoder turns them into the attributes
#: ``schema.ATTR_VIEW_ADDED`` and ``schema.ATTR_VIEW_STORED_PARENT``.
ADDED_COLUMN: Final = "view_added"
STORED_PARENT_COLUMN: Final = "view_stored_parent"
#: A trace of more spans goes to a viewer folded (``fold``). Jaeger's UI slows past about 2k
#: spans per trace and fails at 20-40k; the committed ResNet-50 MFLG iteration (5,126 spans, 5,308
#: with its backward layer spans) renders whole, and a trace of at most 8,192 spans is one OTLP
#: request (``sinks.DEFAULT_MAX_SPANS_PER_REQUEST``).
DEFAULT_MAX_SPANS_PER_TRACE = 8192
#: The summary of a folded op: column -> attribute (``xsp.view.folded.*``).
FOLD_KEYS = {
    "view_folded_spans": "xsp.view.folded.spans",  # every stored span folded into it
    "view_folded_kernels": "xsp.view.folded.kernels",
    "view_folded_kernel_ns": "xsp.view.folded.kernel_ns",  # the kernels' summed durations
    "view_folded_gpu_ns": "xsp.view.folded.gpu_ns",  # kernels, copies and memsets
    "view_folded_api_calls": "xsp.view.folded.api_calls",  # library level: runtime, driver, library
    "view_folded_ops": "xsp.view.folded.ops",  # framework level, where the budget folds it too
    "view_folded_top_kernels": "xsp.view.folded.top_kernels",  # JSON: [{name, ns, count}]
}
#: Kernels by time listed in a summary, under their full names.
TOP_KERNELS = 5
_FOLDED_LEVELS = (schema.LEVEL_LIBRARY, schema.LEVEL_GPU)
#: A summary is a span of the deepest level it folds (its service in Jaeger).
_SUMMARY_LEVELS = (schema.LEVEL_GPU, schema.LEVEL_LIBRARY, schema.LEVEL_FRAMEWORK)
_FOLD_COLUMNS = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "level",
    "kind",
    "name",
    "start_ns",
    "dur_ns",
    "iteration",
    "rank",
    "thread_id",
    "module_path",
    "phase",
    ADDED_COLUMN,
]
_FOLD_TYPES = {name: pa.int64() for name in FOLD_KEYS} | {"view_folded_top_kernels": pa.string()}
WIRE_COLUMNS = (
    (ADDED_COLUMN, schema.ATTR_VIEW_ADDED),
    (STORED_PARENT_COLUMN, schema.ATTR_VIEW_STORED_PARENT),
    *FOLD_KEYS.items(),
)
BACKWARD_SUFFIX = " (backward)"
#: The name of the span over a step's ``AccumulateGrad`` nodes (``with_gradient_accumulation``).
GRADIENT_ACCUMULATION = "gradient accumulation"
#: How autograd names its leaf nodes (``autograd::engine::evaluate_function:
#: torch::autograd::AccumulateGrad``).
_ACCUMULATE_GRAD = "AccumulateGrad"
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


class _BackwardNode(TypedDict):
    """A backward node's ``_NODE_COLUMNS``, as ``with_backward_layers`` reads them."""

    trace_id: bytes
    span_id: int
    parent_span_id: int
    start_ns: int
    dur_ns: int
    module_path: str | None
    thread_id: int | None
    iteration: int | None
    rank: int | None


class _AddedSpan(TypedDict):
    """What every span the view adds holds (a row of the laid-out table)."""

    trace_id: bytes
    span_id: int
    parent_span_id: int
    name: str
    start_ns: int
    dur_ns: int
    level: str
    iteration: int | None
    rank: int | None
    thread_id: int | None
    view_added: bool


class _LayerSpan(_AddedSpan):
    """A layer's backward span, added (``_layer_span``)."""

    kind: str
    phase: str
    module_path: str
    module_type: str | None


class _FoldSummary(_AddedSpan):
    """A folded op's summary span (``_summary``): a row of the folded table."""

    module_path: str | None
    phase: str | None
    view_folded_spans: int
    view_folded_kernels: int
    view_folded_kernel_ns: int
    view_folded_gpu_ns: int
    view_folded_api_calls: int
    view_folded_ops: int
    view_folded_top_kernels: str  # JSON: [{name, ns, count}]


def level_resource(
    resource: Mapping[str, AttributeValue], level: str | None
) -> dict[str, AttributeValue]:
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
    nodes: list[_BackwardNode] = (
        table.select(_NODE_COLUMNS).take(pa.array(rows, pa.int64())).to_pylist()
    )
    backward_ids = {(n["trace_id"], n["span_id"]) for n in nodes}
    # (trace, parent, thread) -> its nodes with their rows
    groups: dict[tuple[bytes, int, int | None], list[tuple[int, _BackwardNode]]] = defaultdict(list)
    for row, node in zip(rows, nodes, strict=True):
        if node["module_path"] and (node["trace_id"], node["parent_span_id"]) not in backward_ids:
            key = (node["trace_id"], node["parent_span_id"], node["thread_id"])
            groups[key].append((int(row), node))
    if not groups:
        return table
    types = _module_types(table)
    added: list[_LayerSpan] = []
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
    members: list[tuple[int, _BackwardNode]],
    types: Mapping[str, str],
    added: list[_LayerSpan],
    moved: dict[int, int],
) -> None:
    """Steps 2 and 3 of the module notes for one group's nodes, in start order."""
    first = members[0][1]
    trace_id, root_parent = first["trace_id"], first["parent_span_id"]
    stack: list[_LayerSpan] = []
    for row, node in members:
        path = node["module_path"] or ""  # every grouped node has one
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
    node: _BackwardNode,
) -> _LayerSpan:
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


def with_gradient_accumulation(table: pa.Table) -> pa.Table:
    """``table`` with each (trace, parent, thread)'s two or more top-level ``AccumulateGrad``
    nodes under one added span ``GRADIENT_ACCUMULATION`` (see the module notes), plus the view's
    columns; the stored rows keep their order, the added spans follow."""
    table = _with_wire_columns(table)
    if not table.num_rows or not {"kind", "name", *_NODE_COLUMNS} <= set(table.column_names):
        return table
    backward = pc.fill_null(
        pc.equal(table.column("kind").cast(pa.string()), schema.KIND_BACKWARD), False
    )
    leaf = pc.ends_with(table.column("name").cast(pa.string()), _ACCUMULATE_GRAD)
    rows = np.flatnonzero(
        pc.and_(backward, pc.fill_null(leaf, False)).to_numpy(zero_copy_only=False)
    )
    if not len(rows):
        return table
    ids = table.select(["trace_id", "span_id"]).filter(backward).to_pylist()
    backward_ids = {(r["trace_id"], r["span_id"]) for r in ids}
    nodes: list[_BackwardNode] = (
        table.select(_NODE_COLUMNS).take(pa.array(rows, pa.int64())).to_pylist()
    )
    groups: dict[tuple[bytes, int, int | None], list[tuple[int, _BackwardNode]]] = defaultdict(list)
    for row, node in zip(rows, nodes, strict=True):
        if (node["trace_id"], node["parent_span_id"]) not in backward_ids:  # top-level ones
            groups[(node["trace_id"], node["parent_span_id"], node["thread_id"])].append(
                (int(row), node)
            )
    parents = table.column("parent_span_id").to_numpy(zero_copy_only=False).copy()
    stored = table.column(STORED_PARENT_COLUMN).to_pylist()
    added: list[_AccumulationSpan] = []
    for members in groups.values():
        if len(members) < 2:  # one node needs no span to gather it
            continue
        span = _accumulation_span([node for _, node in members])
        added.append(span)
        for moved, _ in members:
            stored[moved] = f"{int(parents[moved]):016x}"
            parents[moved] = span["span_id"]
    if not added:
        return table
    table = _replace(table, "parent_span_id", pa.array(parents, pa.uint64()))
    table = _replace(table, STORED_PARENT_COLUMN, pa.array(stored, pa.string()))
    return pa.concat_tables([table, pa.Table.from_pylist(added, schema=table.schema)])


class _AccumulationSpan(_AddedSpan):
    """The span over a group's ``AccumulateGrad`` nodes (``_accumulation_span``)."""

    kind: str
    phase: str


def _accumulation_span(nodes: list[_BackwardNode]) -> _AccumulationSpan:
    first = min(nodes, key=lambda node: (node["start_ns"], node["span_id"]))
    end = max(node["start_ns"] + node["dur_ns"] for node in nodes)
    seed = b"%s/%d/%s/%d" % (
        first["trace_id"],
        first["parent_span_id"],
        GRADIENT_ACCUMULATION.encode(),
        first["span_id"],
    )
    return {
        "trace_id": first["trace_id"],
        "span_id": int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") or 1,
        "parent_span_id": first["parent_span_id"],
        "name": GRADIENT_ACCUMULATION,
        "start_ns": first["start_ns"],
        "dur_ns": end - first["start_ns"],
        "level": schema.LEVEL_FRAMEWORK,
        "iteration": first["iteration"],
        "rank": first["rank"],
        "thread_id": first["thread_id"],
        "kind": schema.KIND_BACKWARD,
        "phase": schema.PHASE_BACKWARD,
        ADDED_COLUMN: True,
    }


def for_viewer(table: pa.Table, max_spans_per_trace: int = DEFAULT_MAX_SPANS_PER_TRACE) -> pa.Table:
    """The viewer's layout of ``table``: backward under its layers, the gradient accumulation
    gathered, then each trace of more than ``max_spans_per_trace`` spans folded (0: none)."""
    laid_out = with_gradient_accumulation(with_backward_layers(table))
    return fold(laid_out, max_spans_per_trace)


def fold(table: pa.Table, max_spans_per_trace: int) -> pa.Table:
    """``table`` (laid out by ``with_backward_layers``) with each trace of more than
    ``max_spans_per_trace`` rows folded (see the module notes); ``table`` itself when none is."""
    needed = set(_FOLD_COLUMNS)
    if max_spans_per_trace <= 0 or not table.num_rows or not needed <= set(table.column_names):
        return table
    counts = pc.value_counts(table.column("trace_id")).to_pylist()
    large = [c["values"] for c in counts if c["counts"] > max_spans_per_trace]
    if not large:
        return table
    in_large = pc.is_in(table.column("trace_id"), pa.array(large, pa.binary(16)))
    rows = np.flatnonzero(in_large.to_numpy(zero_copy_only=False))
    spans = table.select(_FOLD_COLUMNS).take(pa.array(rows, pa.int64())).to_pydict()
    by_trace: dict[bytes, list[int]] = defaultdict(list)
    for index, trace_id in enumerate(spans["trace_id"]):
        by_trace[trace_id].append(index)
    folds: dict[int, list[int]] = defaultdict(list)  # kept span -> the spans folded into it
    for members in by_trace.values():
        anchor = _fold_trace(spans, members, max_spans_per_trace)
        for index, kept in anchor.items():
            if kept != index:
                folds[kept].append(index)
    dropped = np.zeros(table.num_rows, dtype=bool)
    dropped[rows[[i for folded in folds.values() for i in folded]]] = True
    table = _with_fold_columns(table)
    summaries = [_summary(spans, kept, folded) for kept, folded in folds.items()]
    kept_rows = table.filter(pa.array(~dropped))
    return pa.concat_tables([kept_rows, pa.Table.from_pylist(summaries, schema=table.schema)])


def _fold_trace(spans: Mapping[str, list[Any]], members: list[int], budget: int) -> dict[int, int]:
    """Step 1 of ``fold`` for one trace: each member -> the member it is folded into (itself
    when kept)."""
    by_id = {spans["span_id"][i]: i for i in members}
    parent = {i: by_id.get(spans["parent_span_id"][i]) for i in members}
    # the gradient accumulation span adds no depth: its nodes fold as they would at the root
    gathered = {
        i for i in members if spans[ADDED_COLUMN][i] and spans["name"][i] == GRADIENT_ACCUMULATION
    }
    height: dict[int, int] = {}  # a span's depth in the tree: parents come first in ``order``
    depth: dict[int, int] = {}  # the depth the budget counts
    for i in members:
        chain = []
        node: int | None = i
        while node is not None and node not in depth:
            chain.append(node)
            node = parent[node]
            if len(chain) > len(members):  # a cycle: stored data the checks let through
                node = None
        base, base_height = (-1, -1) if node is None else (depth[node], height[node])
        for link in reversed(chain):
            base_height += 1
            base += 0 if parent[link] in gathered else 1
            height[link], depth[link] = base_height, base
    order = sorted(members, key=height.__getitem__)
    deep = {i for i in members if spans["level"][i] in _FOLDED_LEVELS}

    def anchors(limit: int) -> tuple[dict[int, int], int]:
        """Each member's anchor with spans kept down to depth ``limit``, and the spans sent."""
        anchor: dict[int, int] = {}
        for i in order:
            above = parent[i]
            if above is None:
                anchor[i] = i  # a root (or a span whose parent is elsewhere) stays
            elif i not in deep and depth[i] <= limit and anchor[above] == above:
                anchor[i] = i
            else:
                anchor[i] = anchor[above]
        kept = sum(1 for i, a in anchor.items() if a == i)
        return anchor, kept + len({a for i, a in anchor.items() if a != i})

    # the spans sent never fall as the limit deepens (a span kept adds one, takes at most its
    # parent's summary): the deepest limit within the budget is found by bisection
    low, high = 0, max(depth.values())
    while low < high:
        middle = (low + high + 1) // 2
        if anchors(middle)[1] <= budget:
            low = middle
        else:
            high = middle - 1
    return anchors(low)[0]


def _with_fold_columns(table: pa.Table) -> pa.Table:
    for name, type_ in _FOLD_TYPES.items():
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, type_))
    return table


def _summary(spans: Mapping[str, list[Any]], kept: int, folded: list[int]) -> _FoldSummary:
    """The summary span of the spans ``folded`` into span ``kept`` (step 2 of ``fold``)."""
    owner = {name: values[kept] for name, values in spans.items()}
    stored = [i for i in folded if not spans[ADDED_COLUMN][i]]  # not a backward layer span
    names, durs, levels, kinds = (
        [spans[name][i] for i in stored] for name in ("name", "dur_ns", "level", "kind")
    )
    kernels: dict[str, list[int]] = {}
    gpu_ns = gpu = api_calls = ops = 0
    for name, dur, level, kind in zip(names, durs, levels, kinds, strict=True):
        if level == schema.LEVEL_GPU:
            gpu_ns += dur
            gpu += 1
        elif level == schema.LEVEL_LIBRARY:
            api_calls += 1
        elif level == schema.LEVEL_FRAMEWORK:
            ops += 1
        if kind == schema.KIND_KERNEL:
            total = kernels.setdefault(name, [0, 0])
            total[0] += dur
            total[1] += 1
    top = sorted(kernels.items(), key=lambda item: (-item[1][0], item[0]))[:TOP_KERNELS]
    n_kernels = sum(count for _, count in kernels.values())
    start = min(spans["start_ns"][i] for i in folded)
    end = max(spans["start_ns"][i] + spans["dur_ns"][i] for i in folded)
    seed = b"%s/%d/folded" % (owner["trace_id"], owner["span_id"])
    counted = [(ops, "ops"), (api_calls, "API calls"), (n_kernels, "kernels")]
    counted.append((gpu - n_kernels, "copies and memsets"))
    what = [f"{count} {noun}" for count, noun in counted if count]
    return {
        "trace_id": owner["trace_id"],
        "span_id": int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") or 1,
        "parent_span_id": owner["span_id"],
        "name": "folded: " + " · ".join(what),
        "start_ns": start,
        "dur_ns": end - start,
        "level": next((x for x in _SUMMARY_LEVELS if x in levels), schema.LEVEL_FRAMEWORK),
        "iteration": owner["iteration"],
        "rank": owner["rank"],
        "thread_id": owner["thread_id"],
        "module_path": owner["module_path"],
        "phase": owner["phase"],
        ADDED_COLUMN: True,
        "view_folded_spans": len(stored),
        "view_folded_kernels": n_kernels,
        "view_folded_kernel_ns": sum(total for total, _ in kernels.values()),
        "view_folded_gpu_ns": gpu_ns,
        "view_folded_api_calls": api_calls,
        "view_folded_ops": ops,
        "view_folded_top_kernels": json.dumps(
            [{"name": name, "ns": ns, "count": count} for name, (ns, count) in top],
            separators=(",", ":"),
        ),
    }
