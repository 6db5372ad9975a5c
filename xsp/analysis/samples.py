"""Per-iteration samples of one measurement's rows: what ``xsp diff`` compares, each row's value
in every iteration (``xsp.analysis.diff`` takes their medians and a bootstrap of the difference).

The untraced step comes from every complete iteration of the M run; the G run's rows (layers,
GPU activities, ops, critical-path causes) from the replay's steady iterations
(``xsp.analysis.replay``), a row absent from an iteration counting 0 there; memory from the F
run's allocator events, per iteration; counters from the counter run's one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.core import schema

__all__ = [
    "Samples",
    "activity_samples",
    "cause_samples",
    "counter_values",
    "layer_gpu_samples",
    "layer_path_samples",
    "memory_samples",
    "op_samples",
    "pivot",
    "replayed_step_samples",
    "step_samples",
]

#: Activity kinds a GPU activity row can be (kernels, copies, memsets).
_ACTIVITY = (schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET)
_NO_LAYER = "(no layer)"
#: What autograd's spans put before a backward node's name (``CudnnBatchNormBackward0``).
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class Samples:
    """Per-iteration values of one measurement's rows: ``values[row]`` has one value per
    iteration (``iterations`` of them); ``calls[row]`` the row's count per iteration (median)."""

    iterations: int
    values: dict[str, np.ndarray]
    calls: dict[str, float] = field(default_factory=dict)


def pivot(
    keys: Sequence[object],
    iterations: np.ndarray,
    values: np.ndarray,
    kept: np.ndarray,
    calls: bool,
) -> Samples:
    """Sum ``values`` per (key, iteration) over the ``kept`` iterations; a key absent from an
    iteration is 0 there. With ``calls``, each key's median count per iteration too."""
    kept = np.sort(np.asarray(kept, dtype=np.int64))
    iterations = np.asarray(iterations, dtype=np.int64)
    column = np.searchsorted(kept, iterations)
    inside = (column < len(kept)) & (kept[np.minimum(column, len(kept) - 1)] == iterations)
    names, row = np.unique(np.asarray([str(k) for k in keys], dtype=object), return_inverse=True)
    sums = np.zeros((len(names), len(kept)))
    counts = np.zeros((len(names), len(kept)))
    np.add.at(sums, (row[inside], column[inside]), np.asarray(values, dtype=np.float64)[inside])
    np.add.at(counts, (row[inside], column[inside]), 1)
    present = counts.sum(axis=1) > 0  # keys seen only in left-out iterations are no rows
    values_by_name = {str(n): sums[i] for i, n in enumerate(names) if present[i]}
    medians = np.median(counts, axis=1) if len(kept) else np.zeros(len(names))
    counted = {str(n): float(medians[i]) for i, n in enumerate(names) if present[i]}
    return Samples(len(kept), values_by_name, counted if calls else {})


def step_samples(store: MeasurementStore) -> Samples:
    """The untraced step (ns): every complete iteration of the M run."""
    index = next(i for i, run in enumerate(store.runs) if run.levels == "M")
    spans = store.run_spans(index)
    steps = spans.filter(
        pc.and_(
            pc.equal(spans.column("kind").cast(pa.string()), schema.KIND_STEP),
            spans.column("status_message").is_null(),
        )
    )
    return Samples(steps.num_rows, {"untraced step (M)": np.asarray(steps.column("dur_ns"), float)})


@dataclass(frozen=True)
class _Replayed:
    """The deep run's spans as the replay timed them, and its steady iterations."""

    spans: pa.Table
    parent: np.ndarray
    dur_ns: np.ndarray
    iteration: np.ndarray
    kind: np.ndarray
    layer: np.ndarray
    kept: np.ndarray
    path: pa.Table
    step_ns: np.ndarray  # the replayed step of each kept iteration


def _replayed(store: MeasurementStore) -> _Replayed:
    """The replay's timings in arrays, once per store."""
    return _REPLAYED.of(store)


def _replayed_arrays(store: MeasurementStore) -> _Replayed:
    from xsp.analysis.replay import replay

    result = replay(store)
    steps = result.steps
    steady = np.asarray(steps.column("steady"), dtype=bool)
    spans = result.spans
    return _Replayed(
        spans,
        result.parent,
        result.dur_ns,
        np.asarray(spans.column("iteration").fill_null(-1), dtype=np.int64),
        texts(spans.column("kind")),
        texts(spans.column("module_path")),
        np.asarray(steps.column("iteration"), dtype=np.int64)[steady],
        result.path,
        np.asarray(steps.column("replayed_ms"), dtype=np.float64)[steady] * 1e6,
    )


_REPLAYED = Derived("diff_replayed", _replayed_arrays, needs=("replay",))


def replayed_step_samples(store: MeasurementStore) -> Samples:
    """The replayed step (ns) of each steady iteration."""
    found = _replayed(store)
    return Samples(len(found.kept), {"replayed step": found.step_ns})


def _activities(found: _Replayed) -> np.ndarray:
    return np.nonzero(np.isin(found.kind, _ACTIVITY))[0]


def layer_gpu_samples(store: MeasurementStore) -> Samples:
    """Each layer's GPU time (ns; forward, backward and any other phase): the activities its
    ops launched, with the G run's durations."""
    found = _replayed(store)
    rows = _activities(found)
    rows = rows[found.layer[rows] != ""]
    return pivot(
        found.layer[rows].tolist(),
        found.iteration[rows],
        found.dur_ns[rows],
        found.kept,
        calls=False,
    )


def layer_path_samples(store: MeasurementStore) -> Samples:
    """Each layer's time on the replayed step's critical path (ns)."""
    found = _replayed(store)
    row = np.asarray(found.path.column("row"), dtype=np.int64)
    layer = found.layer[row]
    keep = layer != ""
    return pivot(
        layer[keep].tolist(),
        np.asarray(found.path.column("iteration"), dtype=np.int64)[keep],
        np.asarray(found.path.column("dur_ns"), dtype=np.int64)[keep],
        found.kept,
        calls=False,
    )


def cause_samples(store: MeasurementStore) -> Samples:
    """The replayed step's critical path by cause (ns): GPU compute, host work, ..."""
    found = _replayed(store)
    return pivot(
        found.path.column("cause").to_pylist(),
        np.asarray(found.path.column("iteration"), dtype=np.int64),
        np.asarray(found.path.column("dur_ns"), dtype=np.int64),
        found.kept,
        calls=False,
    )


def activity_samples(store: MeasurementStore) -> Samples:
    """GPU activities by name (ns, with calls per iteration): kernels, copies, memsets."""
    found = _replayed(store)
    rows = _activities(found)
    names = found.spans.column("name").cast(pa.string()).take(pa.array(rows)).to_pylist()
    return pivot(names, found.iteration[rows], found.dur_ns[rows], found.kept, calls=True)


def _outermost_ops(found: _Replayed, rows: np.ndarray) -> np.ndarray:
    """Each row's outermost ancestor that is an op or an autograd node (-1 where none): the op
    a layer called (``aten::conv2d``) or the backward node that ran for it."""
    is_op = np.isin(found.kind, (schema.KIND_OP, schema.KIND_BACKWARD))
    best = np.full(len(rows), -1, dtype=np.int64)
    current = found.parent[rows]
    while (current >= 0).any():
        safe = np.maximum(current, 0)
        best = np.where((current >= 0) & is_op[safe], current, best)
        current = np.where(current >= 0, found.parent[safe], -1)
    return best


def op_samples(store: MeasurementStore) -> Samples:
    """Ops by GPU time (ns): the activities each outermost op launched, keyed by the op's
    layer and name ("conv1 aten::conv2d", "bn1 CudnnBatchNormBackward0"), matched so across the measurements."""
    found = _replayed(store)
    rows = _activities(found)
    ops = _outermost_ops(found, rows)
    rows, ops = rows[ops >= 0], ops[ops >= 0]
    names = found.spans.column("name").cast(pa.string()).take(pa.array(ops)).to_pylist()
    keys = [
        f"{layer or _NO_LAYER} {name.removeprefix(_AUTOGRAD_NODE)}"
        for layer, name in zip(found.layer[ops].tolist(), names, strict=True)
    ]
    return pivot(keys, found.iteration[rows], found.dur_ns[rows], found.kept, calls=False)


def memory_samples(store: MeasurementStore) -> Samples | None:
    """Bytes each layer allocates per iteration (level F's allocator events, every device);
    None without events."""
    from xsp.analysis.tables.memory import memory_run

    found = memory_run(store)
    if found is None:
        return None
    events = found[1]
    allocated = np.asarray(events.column("bytes"), dtype=np.int64)
    keep = allocated > 0
    layers = events.column("module_path").cast(pa.string()).fill_null("").to_pylist()
    iteration = np.asarray(events.column("iteration").fill_null(-1), dtype=np.int64)
    kept = np.unique(iteration[iteration >= 0])
    return pivot(
        [layer or _NO_LAYER for layer, k in zip(layers, keep.tolist(), strict=True) if k],
        iteration[keep],
        allocated[keep],
        kept,
        calls=False,
    )


def counter_values(store: MeasurementStore) -> Samples | None:
    """The model's hardware-counter aggregate (A15), one value per numeric metric: a counter
    run counts one pass, so these rows are untested. None without a counter run."""
    from xsp.analysis.tables.counters import model_metrics

    if not store.counter_runs:
        return None
    table = model_metrics(store)
    if not table.num_rows:
        return None
    row = table.to_pylist()[0]
    values = {
        name: np.array([float(value)])
        for name, value in row.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return Samples(1, values)
