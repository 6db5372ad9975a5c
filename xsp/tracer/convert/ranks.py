"""The ranks of a multi-rank job joined into one trace per iteration (pure functions, no I/O).

Each rank converts its own records (``build_table(rank=..., world_size=...)``): its spans carry
its rank, its span ids sit above ``schema.rank_span_id_base(rank)``, and its steps, named
``rank N``, hang under ``schema.iteration_root_id(iteration)`` in a trace whose id every rank
derives from the level set's shared run id. ``join_ranks`` stacks the ranks' tables and adds
those roots: one ``iteration`` span per iteration, from the earliest rank's step start to the
latest one's end, carrying the world size, and the error of a rank whose step failed. Jaeger then
shows each iteration as the root with one ``rank N`` child per rank, each rank's layers and ops
under its own step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema, store

__all__ = ["ROOT_SPAN_NAME", "join_ranks"]

ROOT_SPAN_NAME = schema.ITERATION_SPAN_NAME


def join_ranks(tables: Sequence[pa.Table], world_size: int) -> pa.Table:
    """The ranks' span tables as one, with a root per iteration (schema.SPAN_SCHEMA rows)."""
    spans = pa.concat_tables([t.cast(schema.SPAN_SCHEMA) for t in tables])
    steps = spans.filter(pc.equal(spans.column("kind"), schema.KIND_STEP))
    iteration = np.asarray(steps.column("iteration"), dtype=np.int64)
    start = np.asarray(steps.column("start_ns"), dtype=np.int64)
    end = start + np.asarray(steps.column("dur_ns"), dtype=np.int64)
    rank = np.asarray(steps.column("rank").fill_null(-1), dtype=np.int64)
    errors = steps.column("status_message").to_pylist()
    traces = steps.column("trace_id").to_pylist()
    first: dict[int, int] = {}  # iteration -> its row of the lowest rank
    error: dict[int, str] = {}
    for row in np.lexsort((rank, iteration)).tolist():
        it = int(iteration[row])
        first.setdefault(it, row)
        if errors[row] is not None:
            error.setdefault(it, f"rank {rank[row]}: {errors[row]}")
    its = sorted(first)
    if not its:
        return spans
    keys = np.array(its, dtype=np.int64)
    slot = np.searchsorted(keys, iteration)
    earliest = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
    latest = np.zeros(len(keys), dtype=np.int64)
    np.minimum.at(earliest, slot, start)
    np.maximum.at(latest, slot, end)
    roots = pa.table(
        {
            "trace_id": pa.array([traces[first[it]] for it in its], pa.binary(16)),
            "span_id": pa.array([schema.iteration_root_id(it) for it in its], pa.uint64()),
            "parent_span_id": pa.array(np.zeros(len(its)), pa.uint64()),
            "name": [ROOT_SPAN_NAME] * len(its),
            "start_ns": pa.array(earliest, pa.int64()),
            "dur_ns": pa.array(latest - earliest, pa.int64()),
            "status_message": pa.array([error.get(it) for it in its], pa.string()),
            "level": [schema.LEVEL_MODEL] * len(its),
            "iteration": pa.array(its, pa.int32()),
            "kind": [schema.KIND_ITERATION] * len(its),
            "world_size": pa.array([world_size] * len(its), pa.int32()),
        }
    )
    return pa.concat_tables([store.conform(roots), spans])
