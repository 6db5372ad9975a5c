"""The ops a kernel-changing fix touches in a measurement, as distinct cases to time in isolation
(``xsp.core.store.op_timings.OpCase``), and which spans of the replay's deep run each case owns.

Algorithm notes:

1. The ops are the replay's deep run's (the graph's rows, so that an edit maps onto them by
   row), which is the run that records input shapes (F's deepest level set). A fix touches
   ``TOUCHED[fix]``: channels_last the 4-D convolutions and batch norms, tf32 and bf16 the fp32
   convolutions and GEMMs. An op counts where no op above it is touched (the ``aten::addmm``
   of a linear layer, the ``aten::convolution`` under ``aten::conv2d``).
2. Its backward is the autograd node (a ``backward`` span) of the same rank, iteration and
   sequence number: the op's own, or the nearest op's above it. An op whose input has the shape
   of one of the model call's inputs (the root module's) reads the batch: its backward computes
   no input gradient.
3. A convolution records neither its stride nor its padding. Its output's spatial size is the
   ``grad_output`` of its backward twin's ``aten::convolution_backward``, else its module call's
   output; the padding is taken as ``dilation * (k - 1) // 2`` (what torchvision's and timm's
   convolutions use) or 0, and the stride as the smallest that gives that size. Without an
   output size it is stride 1.
4. Ops of one signature (op, shapes, dtypes, convolution parameters, backward or not) are one
   case; ``per_iteration`` counts them over the deep run's iterations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.derived import DerivedPer
from xsp.analysis.measurement.matching import keyed, level_sources, tree_depths
from xsp.analysis.measurement.op_inputs import json_list
from xsp.analysis.measurement.store import MeasurementStore, text_equals, text_in, texts
from xsp.core import schema
from xsp.core.columns import numbers
from xsp.core.errors import XspError
from xsp.core.intervals import inherit
from xsp.core.store.op_timings import OpCase

__all__ = ["CONVOLUTION", "GEMM", "TOUCHED", "Affected", "affected"]

CONVOLUTION = "aten::convolution"
BATCH_NORM = "aten::batch_norm"
#: GEMM ops; ``aten::linear`` and ``aten::matmul`` run one of these.
GEMM = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")
#: The ops each kernel-changing fix touches (module note 1).
TOUCHED: dict[str, tuple[str, ...]] = {
    "channels_last": (CONVOLUTION, BATCH_NORM),
    "tf32": (CONVOLUTION, *GEMM),
    "bf16": (CONVOLUTION, *GEMM),
}
#: Strides tried for a convolution's recorded output size (module note 3).
MAX_STRIDE = 8


@dataclass(frozen=True)
class Affected:
    """A fix's cases, and the deep run's rows each owns: ``forward_case[row]`` the case index of
    a touched op (-1: none), ``backward_case[row]`` that of its backward node."""

    fix: str
    run_index: int
    cases: list[OpCase]
    forward_case: np.ndarray
    backward_case: np.ndarray


def affected(store: MeasurementStore, fix: str) -> Affected:
    """The ops ``fix`` touches in ``store`` (module notes); XspError for a fix it cannot time."""
    if fix not in TOUCHED:
        raise XspError(
            f"fix {fix!r} changes no op that can be timed alone: use {', '.join(TOUCHED)}"
        )
    return _AFFECTED.of(store, fix)


def _affected(store: MeasurementStore, fix: str) -> Affected:
    run = level_sources(store)[0][-1][0]
    spans, _, parent = keyed(store, run)
    depth = tree_depths(store, run)
    col = _Columns(spans)
    touched = _touched(spans, fix)
    nearest = inherit(np.where(touched, np.arange(len(parent)), -1), parent, depth)
    up = np.maximum(parent, 0)
    outer = touched & ((parent < 0) | (nearest[up] < 0))
    seq = inherit(col.seq, parent, depth)  # an op's own sequence number, or its nearest op's
    nodes = _backward_nodes(spans, col)
    grads = _grad_outputs(spans, col, seq)
    batches = _model_inputs(spans, col)
    keys: dict[str, int] = {}
    cases: list[OpCase] = []
    counts: list[int] = []
    forward_case = np.full(len(parent), -1, dtype=np.int64)
    backward_case = np.full(len(parent), -1, dtype=np.int64)
    for row in np.nonzero(outer)[0].tolist():
        twin = (col.rank[row], col.iteration[row], int(seq[row]))
        node_rows = nodes.get(twin, []) if seq[row] >= 0 else []
        out = grads.get(twin) if seq[row] >= 0 else None
        if out is None:
            out = _module_output(col, parent, row)
        first = (json_list(col.shapes[row]) or [None])[0]
        batch = json.dumps(first) in batches.get((int(col.rank[row]), int(col.iteration[row])), ())
        case = _case(col, row, out, bool(node_rows), not batch)
        if case is None:
            continue
        index = keys.setdefault(case.key, len(cases))
        if index == len(cases):
            cases.append(case)
            counts.append(0)
        counts[index] += 1
        forward_case[row] = index
        backward_case[node_rows] = index
    iterations = max(len({int(i) for i in col.iteration[forward_case >= 0]}), 1)
    cases = [_with_count(c, n / iterations) for c, n in zip(cases, counts, strict=True)]
    return Affected(fix, run, cases, forward_case, backward_case)


class _Columns:
    """The deep run's columns the selection reads, as numpy arrays."""

    def __init__(self, spans: pa.Table) -> None:
        self.name = texts(spans.column("name"))
        self.kind = texts(spans.column("kind"))
        self.shapes = texts(spans.column("input_shapes"), None)
        self.dtypes = texts(spans.column("input_dtypes"), None)
        self.outputs = texts(spans.column("output_shapes"), None)
        self.seq = numbers(spans.column("seq_nr"), null=-1).astype(np.int64, copy=False)
        self.rank = numbers(spans.column("rank"), null=0).astype(np.int64, copy=False)
        self.iteration = numbers(spans.column("iteration"), null=-1).astype(np.int64, copy=False)


def _touched(spans: pa.Table, fix: str) -> np.ndarray:
    ops = text_equals(spans.column("kind"), schema.KIND_OP) & text_in(
        spans.column("name"), TOUCHED[fix]
    )
    names = texts(spans.column("name"))
    shapes = texts(spans.column("input_shapes"), None)
    dtypes = texts(spans.column("input_dtypes"), None)
    for row in np.nonzero(ops)[0].tolist():
        first = json_list(shapes[row])
        x = first[0] if first else None
        dtype = (dtypes[row] or "").split(",")
        if fix == "channels_last":
            ops[row] = isinstance(x, list) and len(x) == 4
        else:  # a precision fix changes fp32 math only: the first matrix's dtype says it
            operand = 1 if names[row] in ("aten::addmm", "aten::baddbmm") else 0
            ops[row] = len(dtype) > operand and dtype[operand] == "float"
    return ops


def _shape(value: Any) -> list[int]:
    ok = isinstance(value, list) and all(isinstance(d, int) for d in value)
    return list(value) if ok else []


def _backward_nodes(spans: pa.Table, col: _Columns) -> dict[tuple[int, int, int], list[int]]:
    """(rank, iteration, sequence number) -> that autograd node's backward spans."""
    out: dict[tuple[int, int, int], list[int]] = {}
    nodes = text_equals(spans.column("kind"), schema.KIND_BACKWARD) & (col.seq >= 0)
    for row in np.nonzero(nodes)[0].tolist():
        key = (int(col.rank[row]), int(col.iteration[row]), int(col.seq[row]))
        out.setdefault(key, []).append(row)
    return out


def _grad_outputs(
    spans: pa.Table, col: _Columns, seq: np.ndarray
) -> dict[tuple[int, int, int], list[int]]:
    """(rank, iteration, sequence number) -> the grad_output shape of the convolution backward
    under that autograd node: the forward convolution's output."""
    out = {}
    for row in np.nonzero(text_equals(spans.column("name"), "aten::convolution_backward"))[0]:
        grad = _shape((json_list(col.shapes[row]) or [None])[0])
        if grad and seq[row] >= 0:
            out[(int(col.rank[row]), int(col.iteration[row]), int(seq[row]))] = grad
    return out


def _module_output(col: _Columns, parent: np.ndarray, row: int) -> list[int] | None:
    """The output of the nearest module call above ``row``, where it is one tensor."""
    up = int(parent[row])
    while up >= 0:
        if col.kind[up] == schema.KIND_MODULE:
            outputs = json_list(col.outputs[up])
            return _shape(outputs[0]) or None if len(outputs) == 1 else None
        up = int(parent[up])
    return None


def _model_inputs(spans: pa.Table, col: _Columns) -> dict[tuple[int, int], set[str]]:
    """(rank, iteration) -> the input shapes of the model's own call (the root module, path
    ""): an op on one of them reads the batch, whose gradient no step needs."""
    out: dict[tuple[int, int], set[str]] = {}
    root = text_equals(spans.column("kind"), schema.KIND_MODULE) & text_equals(
        spans.column("module_path"), ""
    )
    for row in np.nonzero(root)[0].tolist():
        key = (int(col.rank[row]), int(col.iteration[row]))
        out.setdefault(key, set()).update(json.dumps(s) for s in json_list(col.shapes[row]))
    return out


def _case(
    col: _Columns, row: int, out: list[int] | None, backward: bool, input_grad: bool
) -> OpCase | None:
    name = str(col.name[row])
    inputs = [_shape(s) for s in json_list(col.shapes[row])]
    dtypes = (col.dtypes[row] or "").split(",")
    params: dict[str, Any] = {}
    matrices = 3 if name in ("aten::addmm", "aten::baddbmm") else 2 if name in GEMM else 1
    if len(inputs) < matrices or not all(inputs[:matrices]):
        return None  # no shapes recorded (a run without them, or an op without tensors)
    if name == CONVOLUTION:
        if len(inputs) < 2 or len(inputs[0]) < 3 or len(inputs[1]) != len(inputs[0]):
            return None
        params = _conv_params(inputs[0], inputs[1], out)
    signature = json.dumps([name, inputs, dtypes, params, backward, input_grad], sort_keys=True)
    return OpCase(
        key=signature,
        op=name,
        shapes=inputs,
        dtypes=dtypes,
        training=backward,  # a batch norm runs in training mode where the step runs backward
        backward=backward,
        input_grad=input_grad,
        **params,
    )


def _conv_params(x: list[int], w: list[int], out: list[int] | None) -> dict[str, Any]:
    """Stride, padding, dilation and groups of a convolution of input ``x`` and weight ``w``
    whose output is ``out`` (module note 3)."""
    spatial = len(x) - 2
    kernel = w[2:]
    groups = max(x[1] // w[1], 1) if w[1] else 1
    stride, padding = [1] * spatial, [(k - 1) // 2 for k in kernel]
    if out is not None and len(out) == len(x):
        for d in range(spatial):
            found = _stride_padding(x[2 + d], kernel[d], out[2 + d])
            if found is not None:
                stride[d], padding[d] = found
    return {"stride": stride, "padding": padding, "dilation": [1] * spatial, "groups": groups}


def _stride_padding(size: int, k: int, out: int) -> tuple[int, int] | None:
    for pad in ((k - 1) // 2, 0):
        for stride in range(1, MAX_STRIDE + 1):
            if (size + 2 * pad - k) // stride + 1 == out:
                return stride, pad
    return None


def _with_count(case: OpCase, per_iteration: float) -> OpCase:
    return replace(case, per_iteration=per_iteration)


#: The cases of each fix, once per store (``affected``).
_AFFECTED = DerivedPer("affected_ops", _affected, needs=("structural_keys", "tree_depths"))
