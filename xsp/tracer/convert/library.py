"""Level L's conversion: library calls (cuBLAS, cuDNN, oneDNN) under the ops they ran in, and
CUDA API calls under their library call, else their op (by external correlation id, else time).
The columns come from ``xsp.tracer.convert.cuda``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema
from xsp.core.columns import arrow, dictionary_column
from xsp.core.intervals import depths, inherit
from xsp.core.records import ApiRecords, StepRecords
from xsp.tracer.convert.cuda import HostSpans, api_columns, library_columns
from xsp.tracer.convert.table import (
    INHERITED,
    Block,
    Placed,
    SpanTable,
    arrow_of,
    codes_of,
    ids_of,
    take,
)

__all__ = ["convert_library"]


def convert_library(table: SpanTable, api: ApiRecords) -> None:
    """Level L: library calls under their ops, then API calls under their library call or op."""
    calls = _library_call_block(table, api, table.steps, table.framework)
    table.launches = _api_block(table, api, table.steps, table.framework, calls)


def _op_intervals(framework: Placed | None) -> HostSpans | None:
    if framework is None:
        return None
    block = framework.block
    return HostSpans(
        block.columns["start_ns"],
        block.columns["dur_ns"],
        block.columns["thread_id"],
        block.iteration,
        block.external_id,
    )


def _library_call_block(
    table: SpanTable, api: ApiRecords, steps: StepRecords, framework: Placed | None
) -> Placed:
    """cuBLAS/cuDNN (NVTX) calls under the ops they ran in; nested calls take their caller's
    layer and phase."""
    kept, iteration, columns, parent, op_row = library_columns(
        api.library, steps, _op_intervals(framework)
    )
    table.report.events_outside_iterations += len(api.library.start_ns) - len(kept)
    if framework is not None:
        for name in INHERITED:
            columns[name] = take(framework.block.columns[name], op_row)
        depth = depths(parent)
        for name in INHERITED:
            codes = inherit(codes_of(columns[name]), parent, depth)
            values = arrow_of(columns[name]).dictionary.to_pylist()
            columns[name] = dictionary_column(codes, values)
    fw_ids = framework.ids if framework is not None else np.zeros(0, dtype=np.uint64)
    block = Block(
        schema.LEVEL_LIBRARY, iteration.astype(np.int32), parent, columns, ids_of(fw_ids, op_row)
    )
    return Placed(block, table.add(block))


def _api_block(
    table: SpanTable,
    api: ApiRecords,
    steps: StepRecords,
    framework: Placed | None,
    calls: Placed,
) -> Placed:
    """CUDA runtime and driver calls under the library call (else the op) they ran in."""
    block = calls.block
    library = HostSpans(
        block.columns["start_ns"],
        block.columns["dur_ns"],
        block.columns["thread_id"],
        block.iteration,
    )
    kept, iteration, columns, lib_row, op_row, by_id = api_columns(
        api, steps, _op_intervals(framework), library
    )
    table.report.events_outside_iterations += len(api.start_ns) - len(kept)
    table.report.api_ops_by_id += int(by_id.sum())
    table.report.api_ops_by_time += int(((op_row >= 0) & ~by_id).sum())
    if framework is not None:
        in_call = arrow(lib_row >= 0)
        for name in INHERITED:
            from_op = take(framework.block.columns[name], op_row).cast(pa.string())
            from_call = take(calls.block.columns[name], lib_row).cast(pa.string())
            columns[name] = pc.if_else(in_call, from_call, from_op).dictionary_encode()
    fw_ids = framework.ids if framework is not None else np.zeros(0, dtype=np.uint64)
    parents = np.where(lib_row >= 0, ids_of(calls.ids, lib_row), ids_of(fw_ids, op_row))
    block = Block(
        schema.LEVEL_LIBRARY,
        iteration.astype(np.int32),
        np.full(len(kept), -1),
        columns,
        parents.astype(np.uint64),
    )
    return Placed(block, table.add(block))
