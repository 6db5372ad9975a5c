"""Kernels a CUDA graph replays, to the op, layer and phase that made their graph node.

A replayed kernel has no launch of its own: CUPTI correlates it with the graph launch
(``cudaGraphLaunch``), so by nesting it takes the layer and phase of whatever called the replay,
which say nothing of what the kernel computes. While a graph is captured the native core records
which op made each node, with that op's module and phase, and which node each instantiated copy
was cloned from (``GraphNodes``); a kernel's record names the node it replays. Conversion gives
the kernel its node's layer and phase, and the op as ``graph_op``, so that a graphed model and
the same model run eagerly show the same kernels per layer. Nodes made while xsp was not
recording keep the launch's attribution; the run's counts say how many.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from xsp.tracer.convert.columns import arrow, dictionary_column
from xsp.tracer.convert.records import GraphNodes, ModuleInfo
from xsp.tracer.convert.table import codes_of


def attribute(
    columns: dict[str, Any],
    graph_node: np.ndarray,
    nodes: GraphNodes,
    modules: list[ModuleInfo],
) -> tuple[int, int]:
    """Give replayed kernels (``graph_node`` > 0) their node's module, phase and op, in
    ``columns``; returns (kernels replayed from a graph, those whose node was recorded)."""
    replayed = np.nonzero(graph_node > 0)[0]
    columns["graph_node"] = arrow(graph_node, pa.int64(), mask=graph_node <= 0)
    if not len(replayed):
        return 0, 0
    origin = {node: nodes.origin(node) for node in np.unique(graph_node[replayed]).tolist()}
    ops: list[str] = []
    op_code = np.full(len(graph_node), -1, dtype=np.int64)
    known = [row for row in replayed.tolist() if origin[int(graph_node[row])] is not None]
    for row in known:
        node = origin[int(graph_node[row])]
        assert node is not None
        op = nodes.op[node]
        if op:
            op_code[row] = _code(ops, op)
        module, phase = nodes.module[node], nodes.phase[node]
        if 0 <= module < len(modules) and "module_path" in columns:
            columns["module_path"] = _set(columns["module_path"], row, modules[module].path)
        if phase and "phase" in columns:
            columns["phase"] = _set(columns["phase"], row, phase)
    columns["graph_op"] = dictionary_column(op_code, ops)
    for name in ("module_path", "phase"):
        if isinstance(columns.get(name), _Edits):
            columns[name] = columns[name].column()
    return len(replayed), len(known)


def _code(values: list[str], value: str) -> int:
    if value not in values:
        values.append(value)
    return values.index(value)


class _Edits:
    """A dictionary column being rewritten row by row: its codes and values, built once."""

    def __init__(self, column: pa.DictionaryArray) -> None:
        self.codes = codes_of(column)
        self.values: list[str] = column.dictionary.to_pylist()

    def column(self) -> pa.DictionaryArray:
        return dictionary_column(self.codes, self.values)


def _set(column: Any, row: int, value: str) -> _Edits:
    edits = column if isinstance(column, _Edits) else _Edits(column)
    edits.codes[row] = _code(edits.values, value)
    return edits
