"""Leveled reconstruction: one hierarchy per iteration, each span timed by the shallowest run that
measures its level (model latency from M, layers and ops from MF, library calls from MFL, kernels
from MFLG), plus the overhead each added level put on the levels above it.

Algorithm:
1. Every span of every run gets a structural key (``xsp.analysis.measurement.matching``): its parent's key,
   its name and its ordinal among same-named siblings (by start time), under its iteration.
2. The deepest run gives the hierarchy. A span of level L takes the duration of the span with the
   same key in the shallowest run that has level L; a span with no counterpart keeps its own and
   is reported as a mismatch (a structure that differs between runs is reported, not guessed).
3. Timing: the replay's (``xsp.analysis.replay``): host spans on the F run's timeline less the
   tracer's calibrated cost, activities run on their streams once launched, syncs wait for them,
   a rank's collective ends once the last rank has arrived, and the step ends when host and GPU
   are done; so no activity starts before its launch.
4. Hardware counters (the counter run, level set MH) join the kernels by structure too, as
   ``hw_*`` columns (``xsp.analysis.tables.counters``); the counter run's own times are never used.
5. Ranks (a multi-rank job): the ranks' steps run side by side under their iteration, each
   replayed from where the deep run measured it (the ranks share a clock there, which their
   collectives' arrivals are compared on); the iteration spans its ranks' replayed steps.
   The replay lays the iterations end to end, as the untraced program runs them.
6. Identity: the reconstruction is a trace of its own. Its trace id derives from the measurement
   and the iteration, and a span's id is its structural key, so it never merges with a measured
   trace and two reconstructions of one measurement agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.matching import keyed, level_sources
from xsp.analysis.measurement.store import MeasurementStore, text_codes, text_equals, texts
from xsp.analysis.replay import replay
from xsp.analysis.tables.counters import counter_columns
from xsp.analysis.tables.summary import overhead_verdict
from xsp.core import schema
from xsp.core.columns import arrow, numbers, scalar
from xsp.core.intervals import find_rows
from xsp.core.store import RECONSTRUCTED as RECONSTRUCTED_LEVELS

__all__ = [
    "DETAIL_COLUMNS",
    "RECONSTRUCTION",
    "has_replay",
    "layer_gpu_ns",
    "level_overhead",
    "reconstruct",
    "reconstructed_resource",
    "replayed_timeline",
]


def reconstruct(store: MeasurementStore) -> tuple[pa.Table, pa.Table]:
    """(reconstructed spans following schema.SPAN_SCHEMA, mismatches: level, name, iteration);
    computed once per store (the report, the multi-rank analyses and ``--json`` all read it)."""
    return RECONSTRUCTION.of(store)


def has_replay(store: MeasurementStore) -> bool:
    """Whether the measurement is replayed: it has a shallower run to replay its deepest
    against (a measurement of one run is read as traced)."""
    return len(store.runs) > 1


def replayed_timeline(store: MeasurementStore) -> pa.Table | None:
    """The replayed, untraced steps as one timeline (the reconstruction's spans), which every
    view reads by default; None without a replay (``has_replay``)."""
    return reconstruct(store)[0] if has_replay(store) else None


def _reconstruct(store: MeasurementStore) -> tuple[pa.Table, pa.Table]:
    runs, source_of = level_sources(store)
    deepest_index = runs[-1][0]
    deep, key, parent = keyed(store, deepest_index)
    level = texts(deep.column("level"))
    missing = np.zeros(deep.num_rows, dtype=bool)
    spans = deep
    for name, source in source_of.items():
        rows = np.nonzero(level == name)[0]
        table, keys, _ = keyed(store, source)
        found = find_rows(keys, key[rows])
        missing[rows] = found < 0
        if name == schema.LEVEL_FRAMEWORK and source != deepest_index:
            spans = _fill_details(spans, table, rows, found)
    kind = texts(deep.column("kind"))
    gpu = level == schema.LEVEL_GPU
    # the replay's timeline: causal by construction (xsp.analysis.replay), its ranks joined by
    # their collectives
    replayed = replay(store)
    new_start, new_dur = replayed.start_ns.copy(), replayed.dur_ns.copy()
    _span_ranks(
        new_start, new_dur, parent, np.nonzero((kind == schema.KIND_STEP) & (parent >= 0))[0]
    )
    spans = _replace(spans, "layer_gpu_ns", layer_gpu_ns(deep, kind, gpu))
    spans = _replace(spans, "start_ns", arrow(new_start, pa.int64()))
    spans = _replace(spans, "dur_ns", arrow(new_dur, pa.int64()))
    # the counter run's values join the kernels by structure (xsp.analysis.tables.counters)
    for name, values in (counter_columns(store, deep) or {}).items():
        spans = _replace(spans, f"hw_{name}", values)
    spans = _own_identity(spans, store, key, parent)
    spans = _link_requests(spans, parent, store, source_of.get(schema.LEVEL_MODEL, deepest_index))
    spans = spans.cast(schema.SPAN_SCHEMA)
    rows = arrow(np.nonzero(missing)[0], pa.int64())
    miss = pa.table(
        {
            "level": deep.column("level").take(rows).cast(pa.string()),
            "name": deep.column("name").take(rows).cast(pa.string()),
            "iteration": deep.column("iteration").take(rows),
        }
    )
    return spans, miss


def layer_gpu_ns(spans: pa.Table, kind: np.ndarray, gpu: np.ndarray) -> pa.Array:
    """On each module span: the GPU time of its layer's activities in its iteration, forward
    and backward (activities carry their layer's path); null elsewhere. Summed by (iteration,
    path) in numpy: a Python loop over 300k activities took 0.3 s."""
    code, paths = text_codes(spans.column("module_path"))
    named = np.array([bool(p) for p in paths] + [False], dtype=bool)[code]  # -1: the last
    iteration = numbers(spans.column("iteration"), null=-1).astype(np.int64, copy=False)
    dur = numbers(spans.column("dur_ns")).astype(np.int64, copy=False)
    key = iteration * (len(paths) + 1) + code
    rows = np.nonzero(gpu & named)[0]
    groups, group = np.unique(key[rows], return_inverse=True)
    sums = np.zeros(len(groups) + 1, dtype=np.int64)  # the last: no group's (a key above all)
    np.add.at(sums, group.reshape(-1), dur[rows])
    groups = np.append(groups, np.iinfo(np.int64).max)
    at = np.searchsorted(groups, key)
    values = np.where(named & (groups[at] == key), sums[at], 0)  # no activity of it ran: 0
    module = kind == schema.KIND_MODULE
    return arrow(values, pa.int64(), mask=~module)


def _span_ranks(start: np.ndarray, dur: np.ndarray, parent: np.ndarray, ranked: np.ndarray) -> None:
    """Each iteration root of a multi-rank job (the parent of its ranks' steps) set to span its
    ranks' replayed steps, in place."""
    if not len(ranked):
        return
    root = parent[ranked]
    roots_of, at = np.unique(root, return_inverse=True)
    first = np.full(len(roots_of), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(roots_of), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, at, start[ranked])
    np.maximum.at(last, at, start[ranked] + dur[ranked])
    start[roots_of], dur[roots_of] = first, last - first


def _replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _own_identity(
    spans: pa.Table, store: MeasurementStore, key: np.ndarray, parent: np.ndarray
) -> pa.Table:
    """Trace ids from the measurement and iteration, span ids from the structural keys."""
    measurement = next(
        (
            str(r.resource[schema.RES_MEASUREMENT_ID])
            for r in store.runs
            if r.resource.get(schema.RES_MEASUREMENT_ID)
        ),
        str(store.root),
    )
    # one trace id per iteration (none: iteration 0's), taken by each row: not a list of 1M
    iteration = numbers(spans.column("iteration"), null=0).astype(np.int64, copy=False)
    distinct, at = np.unique(iteration, return_inverse=True)
    traces = arrow(
        [schema.trace_id_for(measurement, RECONSTRUCTED_LEVELS, int(it)) for it in distinct],
        pa.binary(16),
    )
    span_id = np.where(key == 0, np.uint64(1), key)
    parent_id = np.where(parent >= 0, span_id[np.maximum(parent, 0)], np.uint64(0))
    spans = _replace(spans, "trace_id", traces.take(arrow(at.reshape(-1), pa.int64())))
    spans = _replace(spans, "span_id", arrow(span_id, pa.uint64()))
    return _replace(spans, "parent_span_id", arrow(parent_id, pa.uint64()))


def _link_requests(
    spans: pa.Table, parent: np.ndarray, store: MeasurementStore, model_run: int
) -> pa.Table:
    """Each root an OpenTelemetry span link to the application span (a request) that its
    iteration's model span ran in, in the run that times it (level M's shallowest); the
    reconstruction keeps its own trace, so no row keeps an application parent."""
    n = spans.num_rows
    spans = _replace(spans, "remote_parent_span_id", pa.nulls(n, pa.uint64()))
    source = store.run_spans(model_run)
    steps = source.filter(
        pc.and_(
            pc.equal(source.column("kind"), scalar(schema.KIND_STEP, pa.string())),
            pc.is_valid(source.column("remote_parent_span_id")),
        )
    )
    requests = {
        it: (trace, span)
        for it, trace, span in zip(
            steps.column("iteration").to_pylist(),
            steps.column("trace_id").to_pylist(),
            steps.column("remote_parent_span_id").to_pylist(),
            strict=True,
        )
    }
    if not requests:
        return spans
    iteration = spans.column("iteration").to_pylist()
    links = [requests.get(it) if parent[row] < 0 else None for row, it in enumerate(iteration)]
    spans = _replace(spans, "link_trace_id", pa.array([k and k[0] for k in links], pa.binary(16)))
    return _replace(spans, "link_span_id", pa.array([k and k[1] for k in links], pa.uint64()))


def reconstructed_resource(store: MeasurementStore) -> dict[str, Any]:
    """The resource of a reconstruction: the deepest run's, marked as rebuilt from all runs."""
    deepest = max(store.runs, key=lambda r: len(r.levels))
    return {
        **deepest.resource,
        schema.RES_LEVELS: RECONSTRUCTED_LEVELS,
        schema.RES_RECONSTRUCTED: True,
        schema.RES_RECONSTRUCTED_FROM: ",".join(r.levels for r in store.runs),
    }


#: Op details the framework run records and deeper runs may leave out (NVTX op ranges carry no
#: dtypes, and by default no shapes).
DETAIL_COLUMNS = ("input_shapes", "input_dtypes")


def _fill_details(
    spans: pa.Table, source: pa.Table, rows: np.ndarray, found: np.ndarray
) -> pa.Table:
    """Fill the op details that ``spans`` lacks at ``rows`` from their matched source rows."""
    index = np.full(spans.num_rows, -1, dtype=np.int64)
    index[rows] = found
    if not (index >= 0).any():
        return spans
    take = pa.array(np.maximum(index, 0), pa.int64(), mask=index < 0)
    for name in DETAIL_COLUMNS:
        filler = source.column(name).combine_chunks().cast(pa.string()).take(take)
        current = spans.column(name).combine_chunks().cast(pa.string())
        spans = spans.set_column(
            spans.schema.get_field_index(name), name, pc.coalesce(current, filler)
        )
    return spans


def level_overhead(store: MeasurementStore, trim: float = 0.1) -> pa.Table:
    """How much each deeper run inflated the spans of each level, against the run that measures
    that level with the fewest levels: level, run (its level set), spans, mean_added_ms,
    trimmed_mean_added_ms, stderr_ms (of the trimmed mean), p50_added_ms, p90_added_ms and a
    verdict (``overhead_verdict``)."""
    runs, source_of = level_sources(store)
    by_run = {}
    for index, _ in runs:
        table, keys, _ = keyed(store, index)
        by_run[index] = (keys, np.asarray(table.column("dur_ns")), table.column("level"))
    out = []
    for name, source in source_of.items():
        for index, run in runs:
            if index == source or name not in run.level_set.timed_levels:
                continue
            keys, dur, level = by_run[index]
            rows = text_equals(level, name)
            source_keys, source_dur, _ = by_run[source]
            found = find_rows(source_keys, keys[rows])
            added = (dur[rows] - source_dur[found])[found >= 0] / 1e6
            if not len(added):
                continue
            values = np.sort(added)
            cut = int(len(values) * trim)
            trimmed = values[cut : len(values) - cut] if len(values) > 2 * cut else values
            mean = float(trimmed.mean())
            stderr = float(trimmed.std(ddof=1) / np.sqrt(len(trimmed))) if len(trimmed) > 1 else 0.0
            out.append(
                {
                    "level": name,
                    "run": run.levels,
                    "spans": len(values),
                    "mean_added_ms": float(values.mean()),
                    "trimmed_mean_added_ms": mean,
                    "stderr_ms": stderr,
                    "p50_added_ms": float(np.percentile(values, 50)),
                    "p90_added_ms": float(np.percentile(values, 90)),
                    "verdict": overhead_verdict(mean, stderr),
                }
            )
    return pa.Table.from_pylist(out)


#: The reconstructed spans and their resource (``reconstruct``).
RECONSTRUCTION = Derived(
    "reconstruction", _reconstruct, needs=("structural_keys", "replay", "counter_join")
)
