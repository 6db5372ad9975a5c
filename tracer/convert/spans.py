"""Raw level records -> one span table (pure functions, no torch, no I/O).

Each level's raw records become a block of rows with local parent links; ``build_table`` stacks
the blocks, gives every row a span id, turns local links into span ids and hangs each level's
top-level rows under the model span of their iteration. Hierarchy comes from recorded nesting and
ids (profiler range nesting on a thread, autograd sequence numbers), never from names.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.tracer import schema
from xsp.tracer.convert.columns import dictionary_column
from xsp.tracer.convert.cuda import api_columns, gpu_columns, library_columns
from xsp.tracer.convert.intervals import depths, inherit, nest
from xsp.tracer.convert.monitor import summarize
from xsp.tracer.convert.records import (
    BACKWARD_PREFIX,
    MODULE_RANGE_PREFIX,
    STEP_RANGE_PREFIX,
    ApiRecords,
    FrameworkRecords,
    GpuRecords,
    MonitorSamples,
    StepRecords,
)

OPTIMIZER_PREFIX = "Optimizer."
#: Codes of the framework block's kind and phase columns: positions in these tuples.
FRAMEWORK_KINDS = (schema.KIND_OP, schema.KIND_MODULE, schema.KIND_BACKWARD, schema.KIND_OPTIMIZER)
PHASES = (schema.PHASE_FORWARD, schema.PHASE_BACKWARD, schema.PHASE_OPTIMIZER)
FORWARD = PHASES.index(schema.PHASE_FORWARD)
STEP_SPAN_NAME = "step"
#: Columns that library, API and GPU spans take from the op (and layer) they run under.
INHERITED = ("module_path", "phase")


@dataclass
class ConversionReport:
    """What conversion kept and what it left out, for the run's manifest."""

    spans: int = 0
    events_outside_iterations: int = 0
    counts_by_level: dict[str, int] = field(default_factory=dict)


@dataclass
class _Block:
    """Rows of one level; ``parent`` indexes rows of the same block (-1: none there), and
    ``foreign_parent`` holds span ids of parents in earlier blocks (0: none); rows with neither
    hang under the model span of their iteration."""

    level: str
    iteration: np.ndarray
    parent: np.ndarray
    columns: dict[str, Any]
    foreign_parent: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.iteration)


def build_table(
    run_id: str,
    levels: str,
    steps: StepRecords,
    framework: FrameworkRecords | None = None,
    failures: dict[int, str] | None = None,
    api: ApiRecords | None = None,
    gpu: GpuRecords | None = None,
    monitor: MonitorSamples | None = None,
) -> tuple[pa.Table, ConversionReport]:
    """Turn one run's raw records into a span table that follows ``schema.SPAN_SCHEMA``.

    ``failures`` maps an iteration to the error that ended it; its model span gets that status.
    Span ids are assigned block by block (model, framework, library, gpu), so a deeper block can
    name its parents in an earlier one.
    """
    report = ConversionReport()
    step_block = _step_block(steps, failures or {})
    if monitor is not None and monitor.time_ns:
        summary = summarize(monitor, list(steps.start_ns), list(steps.end_ns))
        for name in schema.MONITOR_SUMMARIES:
            step_block.columns[f"gpu_{name}"] = pa.array(summary[name], pa.float64())
    step_rows = {int(it): row for row, it in enumerate(step_block.iteration)}
    tables: list[pa.Table] = []
    next_id = 1

    def add(block: _Block) -> np.ndarray:
        nonlocal next_id
        n = len(block)
        ids = np.arange(next_id, next_id + n, dtype=np.uint64)
        next_id += n
        if block.level == schema.LEVEL_MODEL:
            parent_ids = np.zeros(n, dtype=np.uint64)
        else:
            step_of = _lookup(step_rows, block.iteration)
            top = np.where(step_of >= 0, np.maximum(step_of, 0) + 1, 0).astype(np.uint64)
            if block.foreign_parent is not None:
                top = np.where(block.foreign_parent > 0, block.foreign_parent, top).astype(
                    np.uint64
                )
            local = np.where(block.parent >= 0, ids[np.maximum(block.parent, 0)], 0)
            parent_ids = np.where(block.parent >= 0, local, top).astype(np.uint64)
        tables.append(_block_table(run_id, levels, block, ids, parent_ids))
        report.counts_by_level[block.level] = report.counts_by_level.get(block.level, 0) + n
        return ids

    add(step_block)
    fw_block: _Block | None = None
    fw_ids = np.zeros(0, dtype=np.uint64)
    if framework is not None:
        fw_block, outside = _framework_block(framework)
        report.events_outside_iterations += outside
        fw_ids = add(fw_block)
    api_ids = np.zeros(0, dtype=np.uint64)
    api_correlation = np.zeros(0, dtype=np.int64)
    api_iteration = np.zeros(0, dtype=np.int64)
    api_inherited: dict[str, Any] = {}
    if api is not None:
        ops = None
        if fw_block is not None:
            ops = {k: fw_block.columns[k] for k in ("start_ns", "dur_ns", "thread_id")}
            ops["iteration"] = fw_block.iteration
        kept, lib_iteration, columns, lib_parent, op_row = library_columns(api.library, steps, ops)
        report.events_outside_iterations += len(api.library.start_ns) - len(kept)
        if fw_block is not None:
            for name in INHERITED:
                columns[name] = _take(fw_block.columns[name], op_row)
            depth = depths(lib_parent)
            for name in INHERITED:  # nested calls take their caller's
                codes = inherit(_codes(columns[name]), lib_parent, depth)
                columns[name] = dictionary_column(codes, columns[name].dictionary.to_pylist())
        lib_block = _Block(
            schema.LEVEL_LIBRARY,
            lib_iteration.astype(np.int32),
            lib_parent,
            columns,
            _ids_of(fw_ids, op_row),
        )
        lib_ids = add(lib_block)
        library = {k: columns[k] for k in ("start_ns", "dur_ns", "thread_id")}
        library["iteration"] = lib_iteration

        kept, api_iteration, columns, lib_row, op_row = api_columns(api, steps, ops, library)
        report.events_outside_iterations += len(api.start_ns) - len(kept)
        if fw_block is not None:
            is_lib = pa.array(lib_row >= 0)
            for name in INHERITED:
                from_op = _take(fw_block.columns[name], op_row).cast(pa.string())
                from_lib = _take(lib_block.columns[name], lib_row).cast(pa.string())
                columns[name] = pc.if_else(is_lib, from_lib, from_op).dictionary_encode()
            api_inherited = {name: columns[name] for name in INHERITED}
        api_correlation = np.asarray(columns["correlation_id"])
        parents = np.where(lib_row >= 0, _ids_of(lib_ids, lib_row), _ids_of(fw_ids, op_row))
        api_ids = add(
            _Block(
                schema.LEVEL_LIBRARY,
                api_iteration.astype(np.int32),
                np.full(len(kept), -1),
                columns,
                parents.astype(np.uint64),
            )
        )
    if gpu is not None:
        kept, gpu_iteration, columns, api_row = gpu_columns(
            gpu, steps, api_correlation, api_iteration
        )
        report.events_outside_iterations += len(gpu.start_ns) - len(kept)
        for name, column in api_inherited.items():
            columns[name] = _take(column, api_row)
        add(
            _Block(
                schema.LEVEL_GPU,
                gpu_iteration.astype(np.int32),
                np.full(len(kept), -1),
                columns,
                _ids_of(api_ids, api_row),
            )
        )
    table = pa.concat_tables(tables, promote_options="permissive").cast(schema.SPAN_SCHEMA)
    report.spans = table.num_rows
    return table, report


def _ids_of(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Span ids of ``rows`` of an earlier block; 0 where a row is -1."""
    if len(ids) == 0:
        return np.zeros(len(rows), dtype=np.uint64)
    return np.where(rows >= 0, ids[np.maximum(rows, 0)], 0).astype(np.uint64)


def _codes(column: pa.DictionaryArray) -> np.ndarray:
    """A dictionary column's codes, -1 for null."""
    return np.asarray(column.indices.fill_null(-1), dtype=np.int64)


def _take(column: Any, rows: np.ndarray) -> pa.Array:
    """Rows of an arrow column; -1 gives null."""
    indices = pa.array(np.maximum(rows, 0), pa.int64(), mask=rows < 0)
    return column.take(indices)


def _lookup(mapping: dict[int, int], keys: np.ndarray) -> np.ndarray:
    """``mapping[k]`` for each key, -1 where absent (vectorised over few distinct keys)."""
    unique, position = np.unique(keys, return_inverse=True)
    values = np.array([mapping.get(int(k), -1) for k in unique], dtype=np.int64)
    return values[position] if len(keys) else np.zeros(0, dtype=np.int64)


def _block_table(
    run_id: str, levels: str, block: _Block, ids: np.ndarray, parent_ids: np.ndarray
) -> pa.Table:
    n = len(block)
    unique, position = np.unique(block.iteration, return_inverse=True)
    trace_ids = pa.array(
        [schema.trace_id_for(run_id, levels, int(it)) for it in unique], pa.binary(16)
    )
    data: dict[str, Any] = {
        "trace_id": trace_ids.take(pa.array(position.astype(np.int64))),
        "span_id": pa.array(ids, pa.uint64()),
        "parent_span_id": pa.array(parent_ids, pa.uint64()),
        "level": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array([block.level])
        ),
        "iteration": pa.array(block.iteration, pa.int32()),
    }
    data.update(block.columns)
    columns = []
    for field_ in schema.SPAN_SCHEMA:
        value = data.get(field_.name)
        if value is None:
            columns.append(pa.nulls(n, field_.type))
        else:
            columns.append(_as_arrow(value, field_.type))
    return pa.Table.from_arrays(columns, schema=schema.SPAN_SCHEMA)


def _as_arrow(value: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value if value.type == type_ else value.cast(type_)
    if pa.types.is_dictionary(type_):
        return pa.array(value, pa.string()).dictionary_encode().cast(type_)
    return pa.array(value, type_)


def _step_block(steps: StepRecords, failures: dict[int, str]) -> _Block:
    iteration = np.asarray(steps.iteration, dtype=np.int32)
    start = np.asarray(steps.start_ns, dtype=np.int64)
    end = np.asarray(steps.end_ns, dtype=np.int64)
    n = len(iteration)
    return _Block(
        level=schema.LEVEL_MODEL,
        iteration=iteration,
        parent=np.full(n, -1, dtype=np.int64),
        columns={
            "name": [STEP_SPAN_NAME] * n,
            "start_ns": start,
            "dur_ns": end - start,
            "kind": [schema.KIND_STEP] * n,
            "status_message": [failures.get(int(it)) for it in iteration],
        },
    )


def _framework_block(rec: FrameworkRecords) -> tuple[_Block, int]:
    # Strings arrive as codes into small tables of distinct values, so every step below is a
    # numpy or arrow operation over whole columns: conversion must keep up with ~1M spans/s.
    name_values = pa.array(rec.name.values, pa.string())
    name_codes = np.frombuffer(rec.name.codes, dtype=np.int32)
    start = np.frombuffer(rec.start_ns, dtype=np.int64)
    end = np.frombuffer(rec.end_ns, dtype=np.int64)
    thread = np.frombuffer(rec.thread, dtype=np.int64)
    n = len(name_codes)

    def starts(prefix: str) -> np.ndarray:
        by_value = pc.starts_with(name_values, prefix).to_numpy(zero_copy_only=False)
        return by_value[name_codes] if n else np.zeros(0, dtype=bool)

    def suffix_ints(codes: np.ndarray, prefix: str) -> np.ndarray:
        texts = [rec.name.values[c][len(prefix) :] for c in codes]
        return np.array(texts, dtype=np.int64) if texts else np.zeros(0, dtype=np.int64)

    is_step = starts(STEP_RANGE_PREFIX)
    is_module = starts(MODULE_RANGE_PREFIX)
    is_backward = starts(BACKWARD_PREFIX)
    is_optimizer = starts(OPTIMIZER_PREFIX)

    # Iteration of each event: the step range (same clock, any thread) in which it starts. An
    # optimizer range may end just after its step range: the automatic iteration end runs in the
    # optimizer's post-step hook, inside that range.
    step_rows = np.nonzero(is_step)[0]
    order = step_rows[np.argsort(start[step_rows])]
    step_start, step_end = start[order], end[order]
    step_iter = suffix_ints(name_codes[order], STEP_RANGE_PREFIX).astype(np.int32)
    slot = np.searchsorted(step_start, start, side="right") - 1
    if len(order):
        inside = (slot >= 0) & (start <= step_end[np.maximum(slot, 0)])
        iteration = np.where(inside, step_iter[np.maximum(slot, 0)], -1)
    else:
        inside = np.zeros(n, dtype=bool)
        iteration = np.full(n, -1, dtype=np.int32)

    parent = nest(thread, start, end)
    parent = np.where((parent >= 0) & is_step[np.maximum(parent, 0)], -1, parent)

    # Keep events inside an iteration, except the step ranges themselves (the model span
    # replaces them); re-index parents to the kept rows.
    keep = inside & ~is_step
    new_index = np.cumsum(keep) - 1
    parent = np.where(parent >= 0, new_index[np.maximum(parent, 0)], -1)
    rows = np.nonzero(keep)[0]
    parent = parent[rows]
    outside = int((~inside & ~is_step).sum())

    name_codes = name_codes[rows]
    start, end, thread = start[rows], end[rows], thread[rows]
    is_module, is_backward, is_optimizer = is_module[rows], is_backward[rows], is_optimizer[rows]
    seq_nr = np.frombuffer(rec.seq_nr, dtype=np.int64)[rows]
    fwd_thread = np.frombuffer(rec.fwd_thread, dtype=np.int64)[rows]
    depth = depths(parent)
    m = len(rows)

    # Module of each row: its own for module ranges, else inherited from the nearest ancestor.
    module_rows = np.nonzero(is_module)[0]
    call = suffix_ints(name_codes[module_rows], MODULE_RANGE_PREFIX)
    call_module = np.asarray(rec.call_module, dtype=np.int64)
    own_module = np.full(m, -1, dtype=np.int64)
    own_module[module_rows] = call_module[call]

    phase_code = np.full(m, -1, dtype=np.int8)
    phase_code[is_backward] = PHASES.index(schema.PHASE_BACKWARD)
    phase_code[is_optimizer] = PHASES.index(schema.PHASE_OPTIMIZER)
    phase_code[(parent < 0) & (phase_code < 0)] = FORWARD
    phase_code = inherit(phase_code, parent, depth)
    module = inherit(own_module, parent, depth)

    # Backward attribution: an autograd node carries the sequence number of the forward op that
    # created it; that op ran inside a module on the forward thread.
    forward_ops = np.nonzero((phase_code == FORWARD) & (seq_nr >= 0) & (module >= 0) & ~is_module)[
        0
    ]
    by_seq = dict(
        zip(
            zip(thread[forward_ops].tolist(), seq_nr[forward_ops].tolist(), strict=True),
            module[forward_ops].tolist(),
            strict=True,
        )
    )
    backward_rows = np.nonzero(is_backward)[0]
    keys = zip(fwd_thread[backward_rows].tolist(), seq_nr[backward_rows].tolist(), strict=True)
    own_module[backward_rows] = [by_seq.get(key, -1) for key in keys]
    module = inherit(own_module, parent, depth)

    infos = rec.modules
    typed = (is_module | is_backward) & (own_module >= 0)
    kind_codes = np.full(m, FRAMEWORK_KINDS.index(schema.KIND_OP), dtype=np.int64)
    kind_codes[is_module] = FRAMEWORK_KINDS.index(schema.KIND_MODULE)
    kind_codes[is_backward] = FRAMEWORK_KINDS.index(schema.KIND_BACKWARD)
    kind_codes[is_optimizer] = FRAMEWORK_KINDS.index(schema.KIND_OPTIMIZER)

    # Module ranges take their per-call facts (path, shapes, source) instead of the profiler's.
    mods = [infos[i] for i in own_module[module_rows]]
    calls = call.tolist()
    per_call = np.full(m, -1, dtype=np.int64)
    per_call[module_rows] = np.arange(len(module_rows))

    def module_column(texts: list[str | None]) -> pa.DictionaryArray:
        values, codes = _intern(texts)
        return dictionary_column(
            np.where(per_call >= 0, codes[np.maximum(per_call, 0)], -1), values
        )

    base = len(rec.name.values)
    display_codes = np.where(per_call >= 0, base + own_module, name_codes)
    display = dictionary_column(display_codes, rec.name.values + [i.path or i.type for i in infos])
    op_codes = np.where(is_module, -1, name_codes)

    shape_values = rec.input_shapes.values
    shape_codes = np.frombuffer(rec.input_shapes.codes, dtype=np.int32)[rows].astype(np.int64)
    empty = shape_values.index("[]") if "[]" in shape_values else -2
    shape_codes[shape_codes == empty] = -1
    call_values, call_codes = _intern([_shape_text(rec.call_input_shapes[c]) for c in calls])
    shape_codes[module_rows] = len(shape_values) + call_codes
    dtype_values = rec.input_dtypes.values
    dtype_codes = np.frombuffer(rec.input_dtypes.codes, dtype=np.int32)[rows].astype(np.int64)
    blank = dtype_values.index("") if "" in dtype_values else -2
    dtype_codes[(dtype_codes == blank) | is_module] = -1

    params = np.zeros(m, dtype=np.int64)
    params[module_rows] = [i.params for i in mods]
    out_shapes = rec.call_output_shapes
    block = _Block(
        level=schema.LEVEL_FRAMEWORK,
        iteration=iteration[rows].astype(np.int32),
        parent=parent,
        columns={
            "name": display,
            "start_ns": start,
            "dur_ns": end - start,
            "kind": dictionary_column(kind_codes, list(FRAMEWORK_KINDS)),
            "phase": dictionary_column(phase_code.astype(np.int64), list(PHASES)),
            "thread_id": thread,
            "module_path": dictionary_column(module, [i.path for i in infos]),
            "module_type": dictionary_column(
                np.where(typed, own_module, -1), [i.type for i in infos]
            ),
            "module_params": pa.array(params, pa.int64(), mask=per_call < 0),
            "op_name": dictionary_column(op_codes, rec.name.values),
            "input_shapes": dictionary_column(shape_codes, shape_values + call_values),
            "input_dtypes": dictionary_column(dtype_codes, dtype_values),
            "output_shapes": module_column(
                [_shape_text(out_shapes[c]) if c in out_shapes else None for c in calls]
            ),
            "source": module_column([i.source for i in mods]),
            "seq_nr": pa.array(seq_nr, pa.int64(), mask=seq_nr < 0),
        },
    )
    return block, outside


def _intern(texts: list[str | None]) -> tuple[list[str], np.ndarray]:
    """Distinct values of ``texts`` and each entry's code (-1 for None)."""
    index: dict[str, int] = {}
    codes = np.array(
        [-1 if t is None else index.setdefault(t, len(index)) for t in texts], dtype=np.int64
    )
    return list(index), codes


@functools.lru_cache(maxsize=4096)
def _shape_text(shapes: tuple[Any, ...]) -> str:
    """``[[2,3,224,224]]``: the profiler's notation for a list of shapes (cached: few distinct)."""
    return str([list(s) for s in shapes]).replace(" ", "")
