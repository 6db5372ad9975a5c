"""Kernels a CUDA graph replays, to the op, layer and phase that made their graph node.

A replayed kernel has no launch of its own: CUPTI correlates it with the graph launch
(``cudaGraphLaunch``), so by nesting it takes the layer and phase of whatever called the replay,
which say nothing of what the kernel computes. While a graph is captured the native core records
which op made each node, with that op's module and phase, and which node each instantiated copy
was cloned from (``GraphNodes``); a kernel's record names the node it replays. Conversion gives
the kernel its node's layer and phase, and the op as ``graph_op``, so that a graphed model and
the same model run eagerly show the same kernels per layer. Nodes made while xsp was not
recording keep the launch's attribution; the run's counts say how many.

A compiled graph captured whole (``torch.compile(mode="reduce-overhead")``) runs no module
calls, so the nodes its wrapper's library calls make (``aten::convolution``'s cuDNN kernels)
have only the compiled root's module, or none: each capture's calls, in order, take the
modules of the compiled graph whose extern calls they are (``compiled.match_calls``, as a
launched run of the region's calls does); its generated kernels take theirs from inductor's
provenance afterwards.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa

from xsp.core.columns import arrow, dictionary_column
from xsp.core.records import ExternGraph, GraphNodes, ModuleInfo
from xsp.tracer.convert.compiled import common_module, match_calls
from xsp.tracer.convert.table import BlockColumns, codes_of

__all__ = ["attribute", "extern_modules"]


def attribute(
    columns: BlockColumns,
    graph_node: np.ndarray,
    nodes: GraphNodes,
    modules: list[ModuleInfo],
    extern: list[ExternGraph] | None = None,
) -> tuple[int, int]:
    """Give replayed kernels (``graph_node`` > 0) their node's module, phase and op, in
    ``columns``; returns (kernels replayed from a graph, those whose node was recorded).
    ``extern``: the compiled graphs' extern calls, for nodes made by them."""
    replayed = np.nonzero(graph_node > 0)[0]
    columns["graph_node"] = arrow(graph_node, pa.int64(), mask=graph_node <= 0)
    if not len(replayed):
        return 0, 0
    origin = {node: nodes.origin(node) for node in np.unique(graph_node[replayed]).tolist()}
    known, made = [], []
    for row in replayed.tolist():
        node = origin[int(graph_node[row])]
        if node is not None:
            known.append(row)
            made.append(node)
    from_calls = extern_modules(nodes, extern or [])  # inside compiled code: these say more
    paths = [
        from_calls.get(n) or (modules[m].path if 0 <= (m := nodes.module[n]) < len(modules) else "")
        for n in made
    ]
    phases = [nodes.phase[n] for n in made]
    ops = [nodes.op[n] for n in made]
    if "module_path" in columns:
        columns["module_path"] = _overwrite(columns["module_path"], known, paths)
    if "phase" in columns:
        columns["phase"] = _overwrite(columns["phase"], known, phases)
    empty = pa.DictionaryArray.from_arrays(
        pa.nulls(len(graph_node), pa.int32()), pa.array([], pa.string())
    )
    columns["graph_op"] = _overwrite(empty, known, ops)
    return len(replayed), len(known)


def _overwrite(
    column: pa.DictionaryArray, rows: list[int], values: list[str]
) -> pa.DictionaryArray:
    """``column`` with ``values`` in ``rows``; an empty value (not recorded) keeps the row's."""
    codes = codes_of(column)
    texts: list[str] = column.dictionary.to_pylist()
    index = {text: code for code, text in enumerate(texts)}
    for row, value in zip(rows, values, strict=True):
        if value:
            codes[row] = index.setdefault(value, len(index))
    return dictionary_column(codes, list(index))


def extern_modules(nodes: GraphNodes, extern: list[ExternGraph]) -> dict[int, str]:
    """The module of each node made inside a compiled graph's extern call: per capture and
    phase, the calls in the order they ran are matched to the compiled graphs' extern calls
    (``compiled.match_calls``)."""
    recorded = {(graph.phase, op) for graph in extern for op, _ in graph.calls}
    calls: dict[tuple[int, str], dict[int, str]] = defaultdict(dict)  # -> instance: op
    members: dict[int, list[int]] = defaultdict(list)  # instance -> its nodes
    for node, op in nodes.call.items():
        phase = nodes.phase.get(node) or "forward"
        if (phase, op) not in recorded:
            continue
        instance = nodes.instance[node]
        calls[(instance >> 32, phase)][instance] = op
        members[instance].append(node)
    found: dict[int, str] = {}
    for (_, phase), ops in calls.items():
        order = sorted(ops)
        candidates = [graph for graph in extern if graph.phase == phase]
        matched = match_calls([ops[i] for i in order], candidates)
        for instance, sources in zip(order, matched, strict=True):
            path = common_module(sources) if sources else ""
            for node in members[instance]:
                found[node] = path
    return found
