"""Python source per op: the program's lines by the GPU and host time of the ops they called.

Level F records each op's calling Python line (``file:line function``, the innermost frame that
is not torch's or xsp's own) in the deepest level set with F, with the ops' shapes, and copies it
to the later iterations that ran the same ops (``xsp.tracer.convert.shapes``). A row without one
(a CUDA call, a kernel, an autograd node on autograd's thread) takes its nearest op ancestor's:
so a line's GPU time is the G durations of the activities its ops launched, forward and backward
where the backward ran on the calling thread (on the CPU), and its host time the replayed time
its outermost ops cover. Figures are per steady iteration of the replay.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.analysis.replay import replay
from xsp.analysis.tables.kernels import union_length
from xsp.core import schema
from xsp.core.intervals import depths, inherit

__all__ = ["ROW_SOURCES", "line_of", "lines", "row_sources"]


def row_sources(store: MeasurementStore) -> tuple[np.ndarray, list[str]]:
    """Each replayed row's line as a code into the returned values (-1: none): an op's own, any
    other row's its nearest op ancestor's (a module's class source is not a calling line).
    Computed once per store."""
    return ROW_SOURCES.of(store)


def _row_sources(spans: pa.Table, parent: np.ndarray) -> tuple[np.ndarray, list[str]]:
    kind = texts(spans.column("kind"))
    column = spans.column("source").combine_chunks()
    if isinstance(column.type, pa.DictionaryType):
        values = column.dictionary.to_pylist()
        codes = np.asarray(column.indices.fill_null(-1), dtype=np.int64)
    else:
        encoded = column.dictionary_encode()
        values = encoded.dictionary.to_pylist()
        codes = np.asarray(encoded.indices.fill_null(-1), dtype=np.int64)
    own = np.where(kind == schema.KIND_OP, codes, -1)
    blocked = np.isin(kind, (schema.KIND_MODULE, schema.KIND_STEP))  # no line above a layer
    seeded = np.where(blocked & (own < 0), -2, own)
    found = inherit(seeded, parent, depths(parent), missing=-1)
    return np.where(found >= 0, found, -1), values


def lines(store: MeasurementStore, limit: int | None = None) -> pa.Table:
    """The program's lines, most GPU time first, then most host time: source, ops_per_iteration,
    gpu_ms, host_ms (per steady iteration of the replayed step), share_pct (GPU time against
    the replayed step). Empty when no op recorded its line."""
    result = replay(store)
    spans = result.spans
    code, values = row_sources(store)
    if not (code >= 0).any():
        return pa.table({"source": pa.array([], pa.string())})
    steps = result.steps
    kept = np.asarray(steps.column("iteration"))[np.asarray(steps.column("steady"), dtype=bool)]
    iteration = np.asarray(spans.column("iteration").fill_null(-1), dtype=np.int64)
    steady = np.isin(iteration, kept) & (code >= 0)
    level = texts(spans.column("level"))
    kind = texts(spans.column("kind"))
    start, dur = result.start_ns, result.dur_ns
    gpu = steady & (level == schema.LEVEL_GPU)
    ops = steady & (kind == schema.KIND_OP)
    n = max(len(kept), 1)
    replayed = np.asarray(steps.column("replayed_ms"))[np.isin(steps.column("iteration"), kept)]
    step_ms = float(np.median(replayed)) if len(replayed) else 0.0
    gpu_ns = np.bincount(code[gpu], weights=dur[gpu], minlength=len(values))
    op_count = np.bincount(code[ops], minlength=len(values))
    host_ns = np.zeros(len(values))
    rows_ = np.nonzero(ops)[0]
    rows_ = rows_[np.lexsort((iteration[rows_], code[rows_]))]
    group = code[rows_] * (int(iteration.max(initial=0)) + 2) + iteration[rows_]
    bounds = np.flatnonzero(np.diff(group)) + 1
    for part in np.split(rows_, bounds) if len(rows_) else []:
        host_ns[code[part[0]]] += union_length(start[part], start[part] + dur[part])
    rows = [
        {
            "source": values[line],
            "ops_per_iteration": float(op_count[line]) / n,
            "gpu_ms": float(gpu_ns[line]) / n / 1e6,
            "host_ms": float(host_ns[line]) / n / 1e6,
            "share_pct": 100.0 * float(gpu_ns[line]) / n / 1e6 / step_ms if step_ms else 0.0,
        }
        for line in np.unique(code[steady]).tolist()
    ]
    rows.sort(key=lambda r: (-r["gpu_ms"], -r["host_ms"], r["source"]))
    return pa.Table.from_pylist(rows[:limit] if limit else rows)


def line_of(store: MeasurementStore, rows: np.ndarray) -> list[str]:
    """The lines of replayed ``rows``, most frequent first, each once (rows without a line are
    left out)."""
    code, values = row_sources(store)
    found = code[rows]
    found = found[found >= 0]
    if not len(found):
        return []
    lines_, counts = np.unique(found, return_counts=True)
    order = np.lexsort((lines_, -counts))
    return [values[int(c)] for c in lines_[order]]


def _replay_row_sources(store: MeasurementStore) -> tuple[np.ndarray, list[str]]:
    result = replay(store)
    return _row_sources(result.spans, result.parent)


#: Each replayed row's program line (``row_sources``).
ROW_SOURCES = Derived("row_sources", _replay_row_sources, needs=("replay",))
