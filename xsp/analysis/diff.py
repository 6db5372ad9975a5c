"""Two measurements of one workload compared row by row: ``xsp diff BEFORE AFTER``.

Each section pairs the rows of the two measurements by structure (the step; layers by module
path; GPU activities by name; ops by their layer and name; memory by layer; critical-path causes
by cause) and gives each row ``before``, ``after``, ``change``, ``change_pct`` and a verdict.

Algorithm notes:

1. **Samples.** A row's figure is the median of its per-iteration values: the untraced step from
   every complete iteration of the M run; everything from the G run (layers, activities, ops,
   causes) from the replay's steady iterations (``xsp.analysis.replay``), a row absent from an
   iteration counting 0 there; memory from the F run's allocator events, per iteration.
2. **Verdict.** A bootstrap of the difference of medians (``after - before``): each side's
   samples are resampled with replacement (``RESAMPLES`` times, seed ``SEED``); where the 95%
   interval of the differences excludes 0 the row is faster or slower (less or more for bytes),
   else noise. Never from two medians alone: a row needs ``MIN_SAMPLES`` iterations on each
   side, else its verdict is "untested" (a counter run counts one pass of one iteration).
3. **One side only.** A row that one measurement has and the other lacks (a transpose kernel
   that disappears, another cuDNN algorithm) says so in ``match``; its figure on the other side
   is 0 and its verdict is tested all the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.derived import Derived
from xsp.analysis.store import MeasurementStore, texts
from xsp.core import schema
from xsp.core.errors import StoreError

#: Bootstrap resamples per row, their seed, and the interval's confidence.
RESAMPLES = 1000
SEED = 0
CONFIDENCE = 0.95
#: Fewest per-iteration samples on each side for a verdict.
MIN_SAMPLES = 2
#: The test, in the words the output gives it.
TEST = (
    f"bootstrap {CONFIDENCE:.0%} interval of the difference of medians over per-iteration "
    f"samples ({RESAMPLES:,} resamples, seed {SEED}); noise where it holds 0"
)
#: Verdict words (lower, higher) per unit.
VERDICT_WORDS = {"ms": ("faster", "slower"), "bytes": ("less", "more"), "": ("lower", "higher")}
NOISE = "noise"
UNTESTED = "untested"
BOTH, ONLY_BEFORE, ONLY_AFTER = "both", "only before", "only after"
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


@dataclass(frozen=True)
class DiffSection:
    """One compared section: its ``table`` has a ``label`` column named after what its rows are
    (``layer``, ``kernel``), then ``before_<unit>``, ``after_<unit>``, ``change_<unit>``,
    ``change_pct``, the interval ``ci_low_<unit>``/``ci_high_<unit>``, ``verdict`` and
    ``match``; ``absent`` says why a section has no rows."""

    key: str
    title: str
    label: str
    unit: str
    table: pa.Table
    note: str = ""
    absent: str = ""


@dataclass(frozen=True)
class Diff:
    """The comparison of two measurements: sections in the order the output lists them,
    warnings on the pair (different workloads), and what the configurations differ in."""

    before: str
    after: str
    sections: list[DiffSection]
    warnings: list[str]
    changes: list[str]
    test: str = TEST

    def section(self, key: str) -> DiffSection:
        return next(s for s in self.sections if s.key == key)


# -- the statistics --------------------------------------------------------------------------


@functools.cache
def _resample_indices(n: int, salt: int) -> np.ndarray:
    """``RESAMPLES`` x ``n`` indices drawn with replacement, the same for every row of a side
    (a fixed seed: the verdicts do not change between invocations)."""
    rng = np.random.default_rng([SEED, n, salt])
    return rng.integers(0, n, size=(RESAMPLES, n))


def bootstrap_interval(before: np.ndarray, after: np.ndarray) -> tuple[float, float] | None:
    """The ``CONFIDENCE`` interval of median(after) - median(before) by bootstrap; None with
    fewer than ``MIN_SAMPLES`` on a side."""
    if len(before) < MIN_SAMPLES or len(after) < MIN_SAMPLES:
        return None
    medians_before = np.median(before[_resample_indices(len(before), 0)], axis=1)
    medians_after = np.median(after[_resample_indices(len(after), 1)], axis=1)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(medians_after - medians_before, [tail, 100.0 - tail])
    return float(low), float(high)


def verdict(interval: tuple[float, float] | None, unit: str) -> str:
    """faster/slower (less/more for bytes) where the interval excludes 0, else noise."""
    if interval is None:
        return UNTESTED
    lower, higher = VERDICT_WORDS[unit]
    if interval[1] < 0:
        return lower
    if interval[0] > 0:
        return higher
    return NOISE


def compare(before: Samples, after: Samples, label: str, unit: str, scale: float) -> pa.Table:
    """One row per row of either side, largest absolute change first (see the module notes);
    values are divided by ``scale`` (ns to ms)."""
    suffix = f"_{unit}" if unit else ""
    with_calls = bool(before.calls or after.calls)
    rows = []
    for name in sorted(set(before.values) | set(after.values)):
        b = before.values.get(name, np.zeros(before.iterations)) / scale
        a = after.values.get(name, np.zeros(after.iterations)) / scale
        b_median = float(np.median(b)) if len(b) else 0.0
        a_median = float(np.median(a)) if len(a) else 0.0
        interval = bootstrap_interval(b, a)
        change = a_median - b_median
        row: dict[str, Any] = {
            label: name,
            f"before{suffix}": b_median,
            f"after{suffix}": a_median,
            f"change{suffix}": change,
            "change_pct": 100.0 * change / b_median if b_median else None,
            f"ci_low{suffix}": interval[0] if interval else None,
            f"ci_high{suffix}": interval[1] if interval else None,
            "verdict": verdict(interval, unit),
            "match": _match(name, before, after),
        }
        if with_calls:
            row["before_calls_per_iteration"] = before.calls.get(name, 0.0)
            row["after_calls_per_iteration"] = after.calls.get(name, 0.0)
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r[f"change{suffix}"]), r[label]))
    return pa.Table.from_pylist(rows) if rows else pa.table({label: pa.array([], pa.string())})


def _match(name: str, before: Samples, after: Samples) -> str:
    if name not in after.values:
        return ONLY_BEFORE
    if name not in before.values:
        return ONLY_AFTER
    return BOTH


# -- per-iteration samples of one measurement --------------------------------------------------


def _pivot(
    keys: list[Any], iterations: np.ndarray, values: np.ndarray, kept: np.ndarray, calls: bool
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


def require_model_run(store: MeasurementStore) -> None:
    """Raise StoreError unless the measurement has an M run (the untraced step)."""
    if not any(run.levels == "M" for run in store.runs):
        found = ", ".join(run.levels for run in store.runs) or "none"
        raise StoreError(
            f"{store.root}: no M level set (the untraced step), found {found}; "
            "a diff compares untraced steps: run with --levels M,..."
        )


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


def has_gpu(store: MeasurementStore) -> bool:
    """True when a run of the measurement recorded GPU activities (level G)."""
    return any(run.level_set.gpu for run in store.runs)


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
    return _pivot(
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
    return _pivot(
        layer[keep].tolist(),
        np.asarray(found.path.column("iteration"), dtype=np.int64)[keep],
        np.asarray(found.path.column("dur_ns"), dtype=np.int64)[keep],
        found.kept,
        calls=False,
    )


def cause_samples(store: MeasurementStore) -> Samples:
    """The replayed step's critical path by cause (ns): GPU compute, host work, ..."""
    found = _replayed(store)
    return _pivot(
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
    return _pivot(names, found.iteration[rows], found.dur_ns[rows], found.kept, calls=True)


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
    return _pivot(keys, found.iteration[rows], found.dur_ns[rows], found.kept, calls=False)


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
    return _pivot(
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


# -- the comparison --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """One section: what its rows are and how to read each side's samples."""

    key: str
    title: str
    label: str
    unit: str
    samples: Callable[[MeasurementStore], Samples | None]
    needs_replay: bool = True
    note: str = ""


NS_PER_MS = 1e6
SECTIONS = (
    _Spec("step", "Step", "step", "ms", step_samples, needs_replay=False),
    _Spec("replayed_step", "Replayed step", "step", "ms", replayed_step_samples),
    _Spec(
        "layers_gpu",
        "Layers by GPU time (forward + backward)",
        "layer",
        "ms",
        layer_gpu_samples,
        note="the activities each layer's ops launched, G run durations",
    ),
    _Spec(
        "layers_critical_path",
        "Layers by critical-path time (replayed step)",
        "layer",
        "ms",
        layer_path_samples,
    ),
    _Spec(
        "kernels",
        "GPU kernels and copies by name",
        "kernel",
        "ms",
        activity_samples,
        note="calls per iteration beside; 'only before'/'only after': a kernel one side lacks",
    ),
    _Spec(
        "ops",
        "Ops by GPU time",
        "op",
        "ms",
        op_samples,
        note="each outermost op (or autograd node) by its layer and name",
    ),
    _Spec(
        "memory",
        "Memory allocated per layer",
        "layer",
        "bytes",
        memory_samples,
        needs_replay=False,
        note="bytes per iteration, from the F run's allocator events",
    ),
    _Spec(
        "counters",
        "Hardware counters (model aggregate)",
        "metric",
        "",
        counter_values,
        needs_replay=False,
        note="one counted pass each: no per-iteration samples, so no verdict",
    ),
    _Spec(
        "causes",
        "Critical path by cause (replayed step)",
        "cause",
        "ms",
        cause_samples,
    ),
)


def diff(before: MeasurementStore, after: MeasurementStore) -> Diff:
    """Compare two measurements of one workload (see the module notes). Raises StoreError when
    either lacks an M run; a pair of different workloads is compared with a warning."""
    for store in (before, after):
        require_model_run(store)
        store.require_spans()
    unreplayed = _why_no_replay(before) or _why_no_replay(after)
    sections = []
    for spec in SECTIONS:
        if spec.needs_replay and unreplayed:
            sections.append(_absent(spec, unreplayed))
            continue
        b, a = spec.samples(before), spec.samples(after)
        if b is None or a is None:
            where = (
                "either measurement"
                if b is None and a is None
                else ("the before measurement" if b is None else "the after measurement")
            )
            sections.append(_absent(spec, f"none recorded in {where}"))
            continue
        scale = NS_PER_MS if spec.unit == "ms" else 1.0
        table = compare(b, a, spec.label, spec.unit, scale)
        sections.append(DiffSection(spec.key, spec.title, spec.label, spec.unit, table, spec.note))
    return Diff(
        str(before.root),
        str(after.root),
        sections,
        pair_warnings(before, after),
        configuration_changes(before, after),
    )


def _why_no_replay(store: MeasurementStore) -> str | None:
    """Why the sections from the G run and the replay cannot be filled, or None."""
    from xsp.analysis.tables.distributed import is_multi_rank

    if not has_gpu(store):
        return "needs level G in both measurements"
    if is_multi_rank(store):
        return "a multi-rank measurement: the replay and its rows are single-rank"
    return None


def _absent(spec: _Spec, why: str) -> DiffSection:
    empty = pa.table({spec.label: pa.array([], pa.string())})
    return DiffSection(spec.key, spec.title, spec.label, spec.unit, empty, spec.note, why)


#: Resource attributes that describe a measurement's configuration, as the output names them.
CONFIGURATION = {
    schema.RES_WORKLOAD: "workload",
    schema.RES_MODE: "mode",
    schema.RES_BATCH_SIZE: "batch size",
    schema.RES_MEMORY_FORMAT: "memory format",
    schema.RES_DEVICE_NAME: "device",
    schema.RES_TORCH_VERSION: "torch",
    schema.RES_CUDA_VERSION: "CUDA",
}


def _configuration(store: MeasurementStore) -> dict[str, Any]:
    resource = (store.runs[0].meta.get("resource") or {}) if store.runs else {}
    return {name: resource.get(key) for key, name in CONFIGURATION.items()}


def configuration_changes(before: MeasurementStore, after: MeasurementStore) -> list[str]:
    """What differs between the two configurations ("memory format: contiguous ->
    channels_last")."""
    b, a = _configuration(before), _configuration(after)
    return [f"{name}: {b[name]} -> {a[name]}" for name in b if b[name] != a[name]]


def pair_warnings(before: MeasurementStore, after: MeasurementStore) -> list[str]:
    """A warning where the measurements are of different workloads (compared all the same:
    layers and ops of different models match where their names agree)."""
    b, a = _configuration(before), _configuration(after)
    if b["workload"] != a["workload"]:
        return [
            f"different workloads: {b['workload']} against {a['workload']}; rows match by "
            "name only where both have them"
        ]
    return []


def rows_json(result: Diff) -> dict[str, Any]:
    """``xsp diff --json``'s document: the pair, the test, and each section's rows."""
    import math

    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return {
        "before": result.before,
        "after": result.after,
        "test": result.test,
        "changes": result.changes,
        "warnings": result.warnings,
        "sections": {
            s.key: {
                "title": s.title,
                "unit": s.unit,
                "note": s.note,
                "absent": s.absent or None,
                "rows": [{k: clean(v) for k, v in r.items()} for r in s.table.to_pylist()],
            }
            for s in result.sections
        },
    }
