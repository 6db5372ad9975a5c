"""Algorithmic FLOPs: what the math of a measurement's ops takes, counted from the input shapes
level F recorded (formulas in ``xsp.analysis.tables.flop_formulas``), per op, kernel, layer and model.
They stand beside the FLOPs the hardware executed (``xsp.analysis.tables.counters``) and, with G's
kernel durations, give achieved TFLOP/s and model FLOPs utilization (``xsp.analysis.tables.utilization``).

Algorithm notes:

1. The shapes run is the run whose op spans carry input shapes (only the deepest level set with
   F records them): the G run where it does, else the run with the most shaped ops.
2. An op counts when it has a formula and no op above it has one: ``aten::linear``'s
   ``aten::addmm`` counts, the ``aten::cudnn_convolution`` under a counted ``aten::convolution``
   does not. Ops with a formula that their recorded shapes do not fit are counted as
   ``uncounted``.
3. A forward convolution records no output shape (nor its stride and padding). It takes the
   ``grad_output`` of its autograd twin (the ``aten::convolution_backward`` under the backward
   node with the op's sequence number, in training), else the output of the module call it runs
   in where that output fits the convolution (an ``nn.Conv2d``). It is transposed under an
   ``aten::conv_transpose*`` op or in a ``ConvTranspose*`` module.
4. A kernel belongs to the counted op above its launch call, if any. An op of one kernel gives
   it all its FLOPs; an op of several (layout transposes around a cuDNN convolution, a split-K
   reduction, a convolution's backward with its data and weight gradients) splits them among
   its kernels in proportion to the FLOPs each executed where a counter run counted them, else
   in proportion to their durations (``split``).
5. Per iteration: totals over the shapes run's iterations with counted ops, over their number.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.matching import keyed, tree_depths
from xsp.analysis.measurement.op_inputs import json_list
from xsp.analysis.measurement.store import (
    MeasurementStore,
    text_codes,
    text_equals,
    text_in,
    text_matches,
    texts,
)
from xsp.analysis.tables.flop_formulas import (
    CONVOLUTION,
    DTYPE_ROOFS,
    EXACT_FAMILIES,
    FORMULAS,
    Context,
    Shape,
)
from xsp.core import schema
from xsp.core.columns import numbers, scalar
from xsp.core.intervals import inherit

__all__ = [
    "FLOPS",
    "Counted",
    "OpFlops",
    "counted",
    "gpu_run",
    "per_iteration",
    "split",
    "total_per_iteration",
    "uncounted_per_iteration",
]

_COLUMNS = (
    "span_id",
    "kind",
    "name",
    "iteration",
    "rank",
    "module_path",
    "module_type",
    "phase",
    "input_shapes",
    "input_dtypes",
    "output_shapes",
    "seq_nr",
)


@dataclass(frozen=True)
class OpFlops:
    """One counted op span: ``flops`` None where its shapes do not fit its formula."""

    span_id: int
    iteration: int
    name: str
    family: str
    layer: str | None
    phase: str | None
    shapes: str
    dtype: str | None
    roof: str | None
    flops: int | None


@dataclass
class Counted:
    """The counted ops of the shapes run (``run_index`` None: no run recorded shapes), how
    many iterations they span, and which counted op each kernel of that run belongs to."""

    run_index: int | None
    ops: list[OpFlops] = field(default_factory=list)
    iterations: int = 0
    kernel_op: dict[int, int] = field(default_factory=dict)

    @property
    def by_span(self) -> dict[int, OpFlops]:
        return {op.span_id: op for op in self.ops}


def counted(store: MeasurementStore) -> Counted:
    """The measurement's counted ops (see the module notes), computed once per store."""
    return FLOPS.of(store)


def gpu_run(store: MeasurementStore) -> int | None:
    """The run whose kernels the analyses read: the deepest with level G."""
    rows = store.sql("SELECT max(run_index) AS run FROM spans WHERE level = 'gpu'").to_pylist()
    return rows[0]["run"] if rows else None


def _shapes_run(store: MeasurementStore) -> int | None:
    rows = store.sql(
        """SELECT run_index, count(*) AS n FROM spans
           WHERE kind = 'op' AND input_shapes IS NOT NULL GROUP BY run_index"""
    ).to_pylist()
    shaped = {r["run_index"]: r["n"] for r in rows if r["n"]}
    if not shaped:
        return None
    gpu = gpu_run(store)
    return gpu if gpu in shaped else max(shaped, key=lambda run: shaped[run])


@functools.lru_cache(maxsize=1 << 16)
def _shapes(text: str | None) -> list[Shape]:
    """An op's input shapes, [] for each input that is not a tensor."""
    return [s if _is_shape(s) else [] for s in json_list(text)]


def _is_shape(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) for d in value)


def _as_array(column: pa.ChunkedArray) -> np.ndarray:
    """A column as a numpy object array of Python values, None for nulls. Text is decoded once
    per distinct value (``store.texts``): ``to_pylist`` on dictionary-encoded text took 120 ms
    per 100k-row column, and a str per row held 0.3 GB on 1M spans."""
    if (
        pa.types.is_dictionary(column.type)
        or pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
    ):
        return texts(column, None)
    values = numbers(column, null=0).astype(object)  # Python ints, as to_pylist's, but 5x faster
    if column.null_count:
        values[numbers(column.is_null())] = None
    return values


def _not_empty(texts: pa.Array) -> pa.Array:
    return pc.not_equal(texts, scalar("", pa.string()))


class _Spans:
    """One run's spans as columns, with the walks up the parent links the count needs."""

    def __init__(self, store: MeasurementStore, run: int) -> None:
        table = store.run_spans(run).select(list(_COLUMNS))
        # Python values, read one at a time for the ops the count walks; rows are selected in
        # numpy (``where``: a Python pass over 1M rows took 0.1-0.2 s)
        self.col: dict[str, np.ndarray] = {c: _as_array(table.column(c)) for c in _COLUMNS}
        self.table = table
        self.parents = keyed(store, run)[2]  # the parent rows the reconstruction shares
        self.depth = tree_depths(store, run)
        # under a transposed convolution: an ancestor is one (found for all rows at once)
        transpose = self.where("name", lambda t: pc.starts_with(t, "aten::conv_transpose"))
        near = inherit(np.where(transpose, 1, -1), self.parents, self.depth)
        up = self.parents
        self.under_transpose: list[bool] = ((up >= 0) & (near[np.maximum(up, 0)] > 0)).tolist()
        # each layer's type: its last typed row's, as a dict over the rows would keep
        typed = np.nonzero(self.where("module_type", _not_empty))[0][::-1]
        path, _ = text_codes(table.column("module_path"))
        last = typed[np.unique(path[typed], return_index=True)[1]].tolist()
        paths, kinds = self.col["module_path"], self.col["module_type"]
        self.module_types = {paths[i]: kinds[i] for i in last}

    def where(self, column: str, test: Callable[[pa.Array], pa.Array]) -> np.ndarray:
        """The rows whose text in ``column`` passes ``test`` (``store.text_matches``)."""
        return text_matches(self.table.column(column), test)

    def parent(self, i: int) -> int | None:
        up = int(self.parents[i])
        return up if up >= 0 else None

    def ancestors(self, i: int) -> list[int]:
        out, j = [], self.parent(i)
        while j is not None and j not in out:
            out.append(j)
            j = self.parent(j)
        return out


def _count(store: MeasurementStore) -> Counted:
    run = _shapes_run(store)
    if run is None:
        return Counted(None)
    spans = _Spans(store, run)
    col = spans.col
    candidates = np.nonzero(
        text_equals(spans.table.column("kind"), schema.KIND_OP)
        & text_in(spans.table.column("name"), FORMULAS)
        & spans.where("input_shapes", _not_empty)
    )[0].tolist()
    parent, depth = spans.parents, spans.depth
    # the nearest op with a formula at or above each row, found level by level in numpy
    formula_rows = np.full(len(parent), -1, dtype=np.int64)
    formula_rows[candidates] = candidates
    nearest = inherit(formula_rows, parent, depth)
    outermost = [i for i in candidates if parent[i] < 0 or nearest[parent[i]] < 0]
    twins = _backward_twins(spans)
    ops = [_op_flops(spans, i, twins) for i in outermost]
    kernel_op: dict[int, int] = {}
    if run == gpu_run(store):
        counted_rows = np.full(len(parent), -1, dtype=np.int64)
        counted_rows[outermost] = outermost
        owner = inherit(counted_rows, parent, depth)
        kernels = np.nonzero(text_equals(spans.table.column("kind"), schema.KIND_KERNEL))[0]
        kernels = kernels[owner[kernels] >= 0]
        ids, ops_of = col["span_id"], owner[kernels].tolist()
        kernel_op = {ids[i]: ids[o] for i, o in zip(kernels.tolist(), ops_of, strict=True)}
    iterations = len({op.iteration for op in ops})
    return Counted(run, ops, iterations, kernel_op)


def _sequence_number(spans: _Spans, i: int) -> int | None:
    """The autograd sequence number of op ``i`` or of the nearest op above it that has one."""
    for j in [i, *spans.ancestors(i)]:
        if spans.col["seq_nr"][j] is not None:
            return int(spans.col["seq_nr"][j])
    return None


def _backward_twins(spans: _Spans) -> dict[tuple[Any, ...], list[int]]:
    """(rank, iteration, sequence number) -> the grad_output shape of each convolution
    backward, by the sequence number of the backward node it runs under (its forward op's)."""
    out = {}
    backward = text_equals(spans.table.column("name"), "aten::convolution_backward")
    for i in np.nonzero(backward)[0].tolist():
        shapes = json_list(spans.col["input_shapes"][i])
        seq = _sequence_number(spans, i)
        if shapes and _is_shape(shapes[0]) and seq is not None:
            out[(spans.col["rank"][i], spans.col["iteration"][i], seq)] = shapes[0]
    return out


def _transposed(spans: _Spans, i: int) -> bool:
    module = spans.module_types.get(spans.col["module_path"][i]) or ""
    return "ConvTranspose" in module or spans.under_transpose[i]


def _module_output(spans: _Spans, i: int, x: Shape, w: Shape, transposed: bool) -> Shape | None:
    """The output of the module call op ``i`` runs in, where it fits a convolution of input
    ``x`` and weight ``w``: one tensor, the input's rank and batch, the weight's channels."""
    for j in spans.ancestors(i):
        if spans.col["kind"][j] != schema.KIND_MODULE:
            continue
        outputs = json_list(spans.col["output_shapes"][j])
        if len(outputs) != 1 or not _is_shape(outputs[0]):
            return None
        out = outputs[0]
        if len(out) != len(x) or out[0] != x[0]:
            return None
        fits = (out[1] % w[1] == 0) if transposed else out[1] == w[0]
        return out if fits else None
    return None


def _op_flops(spans: _Spans, i: int, twins: dict[tuple[Any, ...], list[int]]) -> OpFlops:
    col = spans.col
    name = col["name"][i]
    formula = FORMULAS[name]
    shapes = _shapes(col["input_shapes"][i])
    dtypes = (col["input_dtypes"][i] or "").split(",")
    dtype = dtypes[formula.operand] if formula.operand < len(dtypes) else None
    context = Context()
    if name != "aten::convolution_backward" and formula.family == CONVOLUTION:
        transposed = _transposed(spans, i)
        seq = _sequence_number(spans, i)
        twin = (col["rank"][i], col["iteration"][i], seq)
        out: Shape | None = twins.get(twin) if seq is not None else None
        if out is None and len(shapes) >= 2 and len(shapes[1]) >= 3 and shapes[0]:
            out = _module_output(spans, i, shapes[0], shapes[1], transposed)
        context = Context(out, transposed)
    elif formula.family == CONVOLUTION:
        context = Context(None, _transposed(spans, i))
    return OpFlops(
        span_id=col["span_id"][i],
        iteration=col["iteration"][i],
        name=name,
        family=formula.family,
        layer=col["module_path"][i],
        phase=col["phase"][i],
        shapes=col["input_shapes"][i],
        dtype=dtype or None,
        roof=DTYPE_ROOFS.get(dtype or ""),
        flops=formula.flops(shapes, context),
    )


def split(
    op_flops: float, executed: Sequence[float | None], durations: Sequence[float]
) -> list[float]:
    """An op's FLOPs among its kernels (module note 4): in proportion to the FLOPs each
    executed where the counters saw any, else to their durations, else evenly."""
    weights = [float(e or 0.0) for e in executed]
    if not sum(weights):
        weights = [float(d) for d in durations]
    if not sum(weights):
        weights = [1.0] * len(executed)
    total = sum(weights)
    return [op_flops * w / total for w in weights]


def per_iteration(store: MeasurementStore, key: str, exact: bool = False) -> dict[Any, float]:
    """Algorithmic FLOPs per iteration summed by an ``OpFlops`` field (``layer``, ``family``,
    ``roof``); ops their shapes do not fit count nothing; ``exact``: only the families counted
    exactly (``flop_formulas.EXACT_FAMILIES``: not the norms' estimate)."""
    found = counted(store)
    out: dict[Any, float] = {}
    for op in found.ops:
        if op.flops is not None and (op.family in EXACT_FAMILIES or not exact):
            out[getattr(op, key)] = out.get(getattr(op, key), 0.0) + op.flops
    return {k: v / found.iterations for k, v in out.items()} if found.iterations else {}


def uncounted_per_iteration(store: MeasurementStore) -> float:
    """Ops per iteration with a formula that their recorded shapes do not fit."""
    found = counted(store)
    missing = sum(1 for op in found.ops if op.flops is None)
    return missing / found.iterations if found.iterations else 0.0


def total_per_iteration(store: MeasurementStore, exact: bool = False) -> float | None:
    """The model's algorithmic FLOPs per iteration (``exact``: as ``per_iteration``); None
    where no run recorded shapes."""
    if counted(store).run_index is None:
        return None
    return math.fsum(per_iteration(store, "family", exact).values())  # in any order alike


#: The FLOPs of each op of the run with shapes (``counted``).
FLOPS = Derived("flops", _count, needs=("structural_keys", "tree_depths"))
