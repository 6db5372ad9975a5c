"""Raw level records -> one span table (pure functions, no torch, no I/O).

Each level's raw records become a block of rows with local parent links; ``build_table`` stacks
the blocks, gives every row a span id, turns local links into span ids and hangs each level's
top-level rows under the model span of their iteration. Hierarchy comes from recorded nesting and
ids (profiler range nesting on a thread, autograd sequence numbers), never from names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.tracer import schema
from xsp.tracer.convert import collectives, compiled
from xsp.tracer.convert.arena import ArenaContents, framework_records, step_records
from xsp.tracer.convert.columns import NullColumns, arrow, dictionary_column, numbers
from xsp.tracer.convert.cuda import api_columns, gpu_columns, library_columns
from xsp.tracer.convert.intervals import depths, inherit, nest
from xsp.tracer.convert.monitor import summarize
from xsp.tracer.convert.records import (
    BACKWARD_PREFIX,
    LOADER_SETTINGS,
    LOADER_SETTINGS_MARK,
    MODULE_RANGE_PREFIX,
    STEP_RANGE_PREFIX,
    ApiRecords,
    FrameworkRecords,
    GpuRecords,
    MonitorSamples,
    StepRecords,
)
from xsp.tracer.convert.shapes import copy_first_iterations_shapes

OPTIMIZER_PREFIX = "Optimizer."
#: PyTorch's DataLoader wraps each batch it hands out in a profiler range of this name.
DATA_LOADER_PREFIX = "enumerate(DataLoader)#"
#: Codes of the framework block's kind and phase columns: positions in these tuples.
FRAMEWORK_KINDS = (
    schema.KIND_OP,
    schema.KIND_MODULE,
    schema.KIND_BACKWARD,
    schema.KIND_OPTIMIZER,
    schema.KIND_DATA_LOADING,
    schema.KIND_COLLECTIVE,
)
PHASES = (
    schema.PHASE_FORWARD,
    schema.PHASE_BACKWARD,
    schema.PHASE_OPTIMIZER,
    schema.PHASE_DATA,
    schema.PHASE_HOST,
)
FORWARD = PHASES.index(schema.PHASE_FORWARD)
STEP_SPAN_NAME = schema.STEP_SPAN_NAME
#: A rank's step in a multi-rank job: named after its rank, so that Jaeger's tree reads
#: iteration -> rank 0, rank 1 and the reconstruction matches each rank's step by name.
RANK_STEP_NAME = "rank {rank}"
#: Columns that library, API and GPU spans take from the op (and layer) they run under.
INHERITED = ("module_path", "phase")


@dataclass
class ConversionReport:
    """What conversion kept and what it left out, for the run's manifest."""

    spans: int = 0
    events_outside_iterations: int = 0
    counts_by_level: dict[str, int] = field(default_factory=dict)
    #: API calls (outside library calls) that reached their op by external correlation id,
    #: and those that fell back to time containment on their thread.
    api_ops_by_id: int = 0
    api_ops_by_time: int = 0
    #: Iterations that neither recorded op shapes nor ran the ops of the one that did.
    iterations_without_op_shapes: int = 0


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
    external_id: np.ndarray | None = None  # framework ops: their CUPTI external correlation id

    def __len__(self) -> int:
        return len(self.iteration)


def build_table(
    run_id: str,
    levels: str,
    records: Mapping[str, Any],
    failures: dict[int, str] | None = None,
    monitor: MonitorSamples | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> tuple[pa.Table, ConversionReport]:
    """Turn one run's raw records into a span table that follows ``schema.SPAN_SCHEMA``.

    ``records`` maps a level's letter to what it recorded (``Level.drain()``, or its part of a
    capture arena); each level's ``CONVERSIONS`` entry turns its records into blocks of rows.
    Level M's are required: every other level hangs under its iteration spans. Span ids are
    assigned block by block, in stack order (model, framework, library calls, API calls, GPU),
    so a deeper block can name its parents in an earlier one. A letter without a conversion
    (level H, whose counters Nsight Compute stores) or without records is skipped.

    ``failures`` maps an iteration to the error that ended it; its model span gets that status.
    ``monitor``: NVML samples summarized onto each model span.

    A rank of a multi-rank job (``rank``, ``world_size``) numbers its spans above
    ``schema.rank_span_id_base(rank)``, marks every span with its rank, names its steps
    ``rank N`` and hangs them under ``schema.iteration_root_id(iteration)``, the root that
    joining the ranks adds (``xsp.tracer.convert.ranks``).
    """
    if records.get(ROOT_LEVEL) is None:
        raise ValueError(f"no records of level {ROOT_LEVEL}: every span hangs under its steps")
    table = _Table(run_id, levels, failures or {}, monitor, rank, world_size)
    for letter, conversion in CONVERSIONS.items():
        if records.get(letter) is not None:
            conversion.convert(table, records[letter])
    return table.finish()


@dataclass
class _Placed:
    """A block already in the table, with the span ids it was given."""

    block: _Block
    ids: np.ndarray

    @staticmethod
    def none() -> _Placed:
        empty = _Block(schema.LEVEL_LIBRARY, np.zeros(0, np.int32), np.zeros(0, np.int64), {})
        return _Placed(empty, np.zeros(0, dtype=np.uint64))


class _Table:
    """The span table being built: blocks in id order, each hung under its iteration's model
    span unless it names its parents. It also holds what the conversion was asked for and what
    earlier levels placed, for the deeper levels to hang under."""

    def __init__(
        self,
        run_id: str,
        levels: str,
        failures: dict[int, str],
        monitor: MonitorSamples | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.run_id, self.levels, self.rank = run_id, levels, rank
        self.failures, self.monitor, self.world_size = failures, monitor, world_size
        self.report = ConversionReport()
        self.tables: list[pa.Table] = []
        self.next_id = schema.rank_span_id_base(rank) + 1
        # level M's iterations, placed first: every other level's top rows hang under them
        self.steps = StepRecords()
        self.step_rows: dict[int, int] = {}
        self.step_ids = np.zeros(0, dtype=np.uint64)
        # what deeper levels hang under: F's ops and compiled kernels' sources, L's API calls
        self.framework: _Placed | None = None
        self.kernel_sources: dict[str, list[list[str]]] = {}
        self.launches = _Placed.none()

    def add(self, block: _Block) -> np.ndarray:
        """Append ``block``; return the span ids its rows got."""
        n = len(block)
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.uint64)
        self.next_id += n
        if block.level == schema.LEVEL_MODEL:
            roots = block.iteration.astype(np.int64) + schema.iteration_root_id(0)
            parent_ids = (roots if self.rank is not None else np.zeros(n)).astype(np.uint64)
            self.step_rows = {int(it): row for row, it in enumerate(block.iteration)}
            self.step_ids = ids
        else:
            step_of = _lookup(self.step_rows, block.iteration)
            top = _ids_of(self.step_ids, step_of)
            if block.foreign_parent is not None:
                top = np.where(block.foreign_parent > 0, block.foreign_parent, top).astype(
                    np.uint64
                )
            local = np.where(block.parent >= 0, ids[np.maximum(block.parent, 0)], 0)
            parent_ids = np.where(block.parent >= 0, local, top).astype(np.uint64)
        if self.rank is not None:
            block.columns["rank"] = arrow(np.full(n, self.rank, np.int32))
        self.tables.append(_block_table(self.run_id, self.levels, block, ids, parent_ids))
        counts = self.report.counts_by_level
        counts[block.level] = counts.get(block.level, 0) + n
        return ids

    def finish(self) -> tuple[pa.Table, ConversionReport]:
        table = pa.concat_tables(self.tables, promote_options="permissive")
        self.report.spans = table.num_rows
        return table.cast(schema.SPAN_SCHEMA), self.report


# -- each level's conversion: its records -> its blocks, added to the table ----------------------
def _convert_model(table: _Table, steps: StepRecords) -> None:
    """Level M: one span per iteration, with the NVML samples of its time summarized on it."""
    block = _step_block(steps, table.failures, table.rank, table.world_size)
    monitor = table.monitor
    if monitor is not None and monitor.time_ns:
        summary = summarize(monitor, list(steps.start_ns), list(steps.end_ns))
        for name in schema.MONITOR_SUMMARIES:
            block.columns[f"gpu_{name}"] = arrow(summary[name], pa.float64())
    table.steps = steps
    table.add(block)


def _convert_framework(table: _Table, framework: FrameworkRecords) -> None:
    """Level F: module calls, ops, autograd nodes and optimizer calls, nested by their ranges."""
    block, outside, without_shapes = _framework_block(framework)
    table.report.events_outside_iterations += outside
    table.report.iterations_without_op_shapes = without_shapes
    table.framework = _Placed(block, table.add(block))
    table.kernel_sources = framework.kernel_sources


def _convert_library(table: _Table, api: ApiRecords) -> None:
    """Level L: library calls under their ops, then API calls under their library call or op."""
    calls = _library_call_block(table, api, table.steps, table.framework)
    table.launches = _api_block(table, api, table.steps, table.framework, calls)


def _convert_gpu(table: _Table, gpu: GpuRecords) -> None:
    """Level G: GPU work under the API call that launched it."""
    _gpu_block(table, gpu, table.steps, table.launches, table.kernel_sources)


@dataclass(frozen=True)
class LevelConversion:
    """What conversion knows of one level: how its records become spans (``convert`` adds its
    blocks to the table being built) and how to read them back from a capture arena
    (``from_arena``; None for a level whose records live elsewhere, such as CUPTI's buffers,
    and die with the process)."""

    convert: Callable[[_Table, Any], None]
    from_arena: Callable[[ArenaContents], Any] | None = None


#: The level every span hangs under: its records are required.
ROOT_LEVEL = "M"
#: Level letter -> its conversion, in stack order (the order span ids are given in). Capture's
#: registry (``xsp.tracer.capture.levels.REGISTRY``) holds the same letters' recording side.
CONVERSIONS: dict[str, LevelConversion] = {
    "M": LevelConversion(_convert_model, from_arena=step_records),
    "F": LevelConversion(_convert_framework, from_arena=framework_records),
    "L": LevelConversion(_convert_library),
    "G": LevelConversion(_convert_gpu),
}


def _op_intervals(framework: _Placed | None) -> dict[str, Any] | None:
    if framework is None:
        return None
    ops = {k: framework.block.columns[k] for k in ("start_ns", "dur_ns", "thread_id")}
    ops["iteration"] = framework.block.iteration
    ops["external_id"] = framework.block.external_id
    return ops


def _library_call_block(
    table: _Table, api: ApiRecords, steps: StepRecords, framework: _Placed | None
) -> _Placed:
    """cuBLAS/cuDNN (NVTX) calls under the ops they ran in; nested calls take their caller's
    layer and phase."""
    kept, iteration, columns, parent, op_row = library_columns(
        api.library, steps, _op_intervals(framework)
    )
    table.report.events_outside_iterations += len(api.library.start_ns) - len(kept)
    if framework is not None:
        for name in INHERITED:
            columns[name] = _take(framework.block.columns[name], op_row)
        depth = depths(parent)
        for name in INHERITED:
            codes = inherit(_codes(columns[name]), parent, depth)
            columns[name] = dictionary_column(codes, columns[name].dictionary.to_pylist())
    fw_ids = framework.ids if framework is not None else np.zeros(0, dtype=np.uint64)
    block = _Block(
        schema.LEVEL_LIBRARY, iteration.astype(np.int32), parent, columns, _ids_of(fw_ids, op_row)
    )
    return _Placed(block, table.add(block))


def _api_block(
    table: _Table,
    api: ApiRecords,
    steps: StepRecords,
    framework: _Placed | None,
    calls: _Placed,
) -> _Placed:
    """CUDA runtime and driver calls under the library call (else the op) they ran in."""
    library = {k: calls.block.columns[k] for k in ("start_ns", "dur_ns", "thread_id")}
    library["iteration"] = calls.block.iteration
    kept, iteration, columns, lib_row, op_row, by_id = api_columns(
        api, steps, _op_intervals(framework), library
    )
    table.report.events_outside_iterations += len(api.start_ns) - len(kept)
    table.report.api_ops_by_id += int(by_id.sum())
    table.report.api_ops_by_time += int(((op_row >= 0) & ~by_id).sum())
    if framework is not None:
        in_call = arrow(lib_row >= 0)
        for name in INHERITED:
            from_op = _take(framework.block.columns[name], op_row).cast(pa.string())
            from_call = _take(calls.block.columns[name], lib_row).cast(pa.string())
            columns[name] = pc.if_else(in_call, from_call, from_op).dictionary_encode()
    fw_ids = framework.ids if framework is not None else np.zeros(0, dtype=np.uint64)
    parents = np.where(lib_row >= 0, _ids_of(calls.ids, lib_row), _ids_of(fw_ids, op_row))
    block = _Block(
        schema.LEVEL_LIBRARY,
        iteration.astype(np.int32),
        np.full(len(kept), -1),
        columns,
        parents.astype(np.uint64),
    )
    return _Placed(block, table.add(block))


def _gpu_block(
    table: _Table,
    gpu: GpuRecords,
    steps: StepRecords,
    launches: _Placed,
    sources: dict[str, list[list[str]]],
) -> None:
    """Kernels, copies and sets under the API call that launched them (CUPTI correlation id),
    with that call's layer and phase; a compiled kernel with the module inductor's provenance
    names (``sources``)."""
    correlation = np.asarray(launches.block.columns.get("correlation_id", []), dtype=np.int64)
    kept, iteration, columns, api_row = gpu_columns(
        gpu, steps, correlation, launches.block.iteration.astype(np.int64)
    )
    table.report.events_outside_iterations += len(gpu.start_ns) - len(kept)
    for name in INHERITED:
        if name in launches.block.columns:
            columns[name] = _take(launches.block.columns[name], api_row)
    if sources and "module_path" in columns:
        launch_parents = launches.block.foreign_parent
        regions = _ids_of(launch_parents, api_row) if launch_parents is not None else api_row
        columns["module_path"] = compiled.attribute(
            columns["module_path"],
            columns["name"].cast(pa.string()).to_pylist(),
            columns["phase"].cast(pa.string()).to_pylist(),
            regions,
            columns["start_ns"],
            sources,
        )
    block = _Block(
        schema.LEVEL_GPU,
        iteration.astype(np.int32),
        np.full(len(kept), -1),
        columns,
        _ids_of(launches.ids, api_row),
    )
    table.add(block)


def _ids_of(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Span ids of ``rows`` of an earlier block; 0 where a row is -1."""
    if len(ids) == 0:
        return np.zeros(len(rows), dtype=np.uint64)
    return np.where(rows >= 0, ids[np.maximum(rows, 0)], 0).astype(np.uint64)


def _codes(column: pa.DictionaryArray) -> np.ndarray:
    """A dictionary column's codes, -1 for null."""
    return numbers(column.indices, null=-1).astype(np.int64)


def _take(column: Any, rows: np.ndarray) -> pa.Array:
    """Rows of an arrow column; -1 gives null."""
    indices = arrow(np.maximum(rows, 0), pa.int64(), mask=rows < 0)
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
    trace_ids = arrow(
        [schema.trace_id_for(run_id, levels, int(it)) for it in unique], pa.binary(16)
    )
    data: dict[str, Any] = {
        "trace_id": trace_ids.take(arrow(position.astype(np.int64))),
        "span_id": arrow(ids, pa.uint64()),
        "parent_span_id": arrow(parent_ids, pa.uint64()),
        "level": pa.DictionaryArray.from_arrays(
            arrow(np.zeros(n, dtype=np.int32)), arrow([block.level], pa.string())
        ),
        "iteration": arrow(block.iteration, pa.int32()),
    }
    data.update(block.columns)
    columns = []
    nulls = NullColumns(n)
    for field_ in schema.SPAN_SCHEMA:
        value = data.get(field_.name)
        if value is None:
            columns.append(nulls(field_.type))
        else:
            columns.append(_as_arrow(value, field_.type))
    return pa.Table.from_arrays(columns, schema=schema.SPAN_SCHEMA)


def _as_arrow(value: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value if value.type == type_ else value.cast(type_)
    if pa.types.is_dictionary(type_):
        return arrow(value, pa.string()).dictionary_encode().cast(type_)
    return arrow(value, type_)


def _step_block(
    steps: StepRecords,
    failures: dict[int, str],
    rank: int | None = None,
    world_size: int | None = None,
) -> _Block:
    iteration = np.asarray(steps.iteration, dtype=np.int32)
    start = np.asarray(steps.start_ns, dtype=np.int64)
    end = np.asarray(steps.end_ns, dtype=np.int64)
    n = len(iteration)
    name = STEP_SPAN_NAME if rank is None else RANK_STEP_NAME.format(rank=rank)
    columns: dict[str, Any] = {
        "name": [name] * n,
        "start_ns": start,
        "dur_ns": end - start,
        "kind": [schema.KIND_STEP] * n,
        "status_message": [failures.get(int(it)) for it in iteration],
    }
    if world_size is not None:
        columns["world_size"] = arrow(np.full(n, world_size, np.int32))
    return _Block(
        level=schema.LEVEL_MODEL,
        iteration=iteration,
        parent=np.full(n, -1, dtype=np.int64),
        columns=columns,
    )


def _framework_block(rec: FrameworkRecords) -> tuple[_Block, int, int]:
    """The framework level's rows: module calls, ops, autograd nodes and optimizer calls of the
    measured iterations, nested by their recorded ranges; returns the block, how many events
    fell outside every iteration, and how many iterations have no op shapes (see
    ``xsp.tracer.convert.shapes``).

    Strings arrive as codes into small tables of distinct values, so every step is a numpy or
    arrow operation over whole columns: conversion must keep up with ~1M spans/s."""
    events = _framework_events(rec)
    call = np.full(len(events.rows), -1, dtype=np.int64)
    modules = np.nonzero(events.is_module)[0]
    call[modules] = _suffix_ints(rec, events.name_codes[modules], MODULE_RANGE_PREFIX)
    without_shapes = copy_first_iterations_shapes(
        rec, events.rows, events.iteration, events.thread, events.start, call
    )
    layers = _attribute_layers(rec, events)
    external = np.frombuffer(rec.external_id, dtype=np.int64)
    columns = _framework_columns(rec, events, layers)
    if rec.kernel_sources:  # on CPU, compiled kernels are profiler ranges
        columns["module_path"] = compiled.attribute(
            columns["module_path"],
            columns["op_name"].cast(pa.string()).to_pylist(),
            columns["phase"].cast(pa.string()).to_pylist(),
            events.parent,
            events.start,
            rec.kernel_sources,
        )
    block = _Block(
        level=schema.LEVEL_FRAMEWORK,
        iteration=events.iteration,
        parent=events.parent,
        columns=columns,
        external_id=external[events.rows] if len(external) == len(rec.start_ns) else None,
    )
    return block, events.outside, without_shapes


@dataclass
class _Events:
    """The profiler events of the measured iterations (step ranges dropped), their nesting and
    what their names say they are."""

    rows: np.ndarray  # positions in the raw records
    iteration: np.ndarray
    parent: np.ndarray  # row of the enclosing event, -1 for the model span
    name_codes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    thread: np.ndarray
    is_module: np.ndarray
    is_backward: np.ndarray
    is_optimizer: np.ndarray
    is_data: np.ndarray
    is_collective: np.ndarray
    is_collective_work: np.ndarray  # the backend's (gloo:, nccl:), not c10d's call
    seq_nr: np.ndarray
    fwd_thread: np.ndarray
    outside: int


def _framework_events(rec: FrameworkRecords) -> _Events:
    """Assign each event to the step range (same clock, any thread) in which it starts, nest the
    events of each thread, and keep those inside an iteration except the step ranges themselves
    (the model span replaces them). An optimizer range may end just after its step range: the
    automatic iteration end runs in the optimizer's post-step hook, inside that range."""
    name_codes = np.frombuffer(rec.name.codes, dtype=np.int32)
    start = np.frombuffer(rec.start_ns, dtype=np.int64)
    end = np.frombuffer(rec.end_ns, dtype=np.int64)
    thread = np.frombuffer(rec.thread, dtype=np.int64)
    n = len(name_codes)

    values = arrow(rec.name.values, pa.string())  # once: module-call names make thousands

    def starts(prefix: str) -> np.ndarray:
        by_value = numbers(pc.starts_with(values, prefix))
        return by_value[name_codes] if n else np.zeros(0, dtype=bool)

    is_step = starts(STEP_RANGE_PREFIX)
    step_rows = np.nonzero(is_step)[0]
    order = step_rows[np.argsort(start[step_rows])]
    step_start, step_end = start[order], end[order]
    step_iter = _suffix_ints(rec, name_codes[order], STEP_RANGE_PREFIX).astype(np.int32)
    slot = np.searchsorted(step_start, start, side="right") - 1
    if len(order):
        inside = (slot >= 0) & (start <= step_end[np.maximum(slot, 0)])
        iteration = np.where(inside, step_iter[np.maximum(slot, 0)], -1)
    else:
        inside = np.zeros(n, dtype=bool)
        iteration = np.full(n, -1, dtype=np.int32)

    parent = nest(thread, start, end)
    parent = np.where((parent >= 0) & is_step[np.maximum(parent, 0)], -1, parent)
    keep = inside & ~is_step
    new_index = np.cumsum(keep) - 1
    parent = np.where(parent >= 0, new_index[np.maximum(parent, 0)], -1)
    rows = np.nonzero(keep)[0]
    return _Events(
        rows=rows,
        iteration=iteration[rows].astype(np.int32),
        parent=parent[rows],
        name_codes=name_codes[rows],
        start=start[rows],
        end=end[rows],
        thread=thread[rows],
        is_module=starts(MODULE_RANGE_PREFIX)[rows],
        is_backward=starts(BACKWARD_PREFIX)[rows],
        is_optimizer=starts(OPTIMIZER_PREFIX)[rows],
        is_data=starts(DATA_LOADER_PREFIX)[rows],
        is_collective=np.logical_or.reduce([starts(p)[rows] for p in collectives.PREFIXES]),
        is_collective_work=np.logical_or.reduce(
            [starts(p)[rows] for p in collectives.WORK_PREFIXES]
        ),
        seq_nr=np.frombuffer(rec.seq_nr, dtype=np.int64)[rows],
        fwd_thread=np.frombuffer(rec.fwd_thread, dtype=np.int64)[rows],
        outside=int((~inside & ~is_step).sum()),
    )


def _suffix_ints(rec: FrameworkRecords, codes: np.ndarray, prefix: str) -> np.ndarray:
    """The integer after ``prefix`` in each name (step and module ranges are numbered)."""
    texts = [rec.name.values[c][len(prefix) :] for c in codes]
    return np.array(texts, dtype=np.int64) if texts else np.zeros(0, dtype=np.int64)


def _between_steps(ev: _Events) -> np.ndarray:
    """Top-level host work of an iteration before its first layer call or after its last
    optimizer call: copying the batch to the device, ``loss.item()`` and logging after the step."""
    never = np.iinfo(np.int64).max
    iterations, slot = np.unique(ev.iteration, return_inverse=True)
    slot = slot.ravel()
    first_call = np.full(len(iterations), never)
    np.minimum.at(first_call, slot[ev.is_module], ev.start[ev.is_module])
    last_step = np.full(len(iterations), np.iinfo(np.int64).min)
    np.maximum.at(last_step, slot[ev.is_optimizer], ev.end[ev.is_optimizer])
    last_step[last_step == np.iinfo(np.int64).min] = never  # no step: nothing comes after it
    return (ev.end <= first_call[slot]) | (ev.start >= last_step[slot])


@dataclass
class _Layers:
    """Which layer (module) and phase each event belongs to."""

    own_module: np.ndarray  # module ranges: their module; attributed backward nodes: theirs
    module: np.ndarray  # own, else the nearest ancestor's
    phase_code: np.ndarray  # positions in PHASES
    module_rows: np.ndarray  # rows of module ranges
    call: np.ndarray  # their module-call numbers


def _attribute_layers(rec: FrameworkRecords, ev: _Events) -> _Layers:
    """Module and phase of each event: its own for module ranges, else inherited from the
    nearest ancestor; an autograd node carries the sequence number of the forward op that
    created it, and that op ran inside a module on the forward thread."""
    depth = depths(ev.parent)
    m = len(ev.rows)
    module_rows = np.nonzero(ev.is_module)[0]
    call = _suffix_ints(rec, ev.name_codes[module_rows], MODULE_RANGE_PREFIX)
    own_module = np.full(m, -1, dtype=np.int64)
    own_module[module_rows] = np.asarray(rec.call_module, dtype=np.int64)[call]

    phase_code = np.full(m, -1, dtype=np.int8)
    phase_code[ev.is_backward] = PHASES.index(schema.PHASE_BACKWARD)
    phase_code[ev.is_optimizer] = PHASES.index(schema.PHASE_OPTIMIZER)
    phase_code[ev.is_data] = PHASES.index(schema.PHASE_DATA)
    # a collective's work range runs on the backend's own thread, outside any phase
    top = (ev.parent < 0) & (phase_code < 0) & ~ev.is_collective_work
    phase_code[top & _between_steps(ev)] = PHASES.index(schema.PHASE_HOST)
    phase_code[top & (phase_code < 0)] = FORWARD
    phase_code = inherit(phase_code, ev.parent, depth)
    module = inherit(own_module, ev.parent, depth)

    forward_ops = np.nonzero(
        (phase_code == FORWARD) & (ev.seq_nr >= 0) & (module >= 0) & ~ev.is_module
    )[0]
    created_in = dict(
        zip(
            zip(ev.thread[forward_ops].tolist(), ev.seq_nr[forward_ops].tolist(), strict=True),
            module[forward_ops].tolist(),
            strict=True,
        )
    )
    backward_rows = np.nonzero(ev.is_backward)[0]
    keys = zip(
        ev.fwd_thread[backward_rows].tolist(), ev.seq_nr[backward_rows].tolist(), strict=True
    )
    own_module[backward_rows] = [created_in.get(key, -1) for key in keys]
    module = inherit(own_module, ev.parent, depth)
    return _Layers(own_module, module, phase_code, module_rows, call)


def _framework_columns(rec: FrameworkRecords, ev: _Events, layers: _Layers) -> dict[str, Any]:
    """The span columns of the framework rows. Module ranges take their per-call facts (path,
    shapes, source, parameters) instead of the profiler's."""
    m = len(ev.rows)
    infos = rec.modules
    own_module, module_rows = layers.own_module, layers.module_rows
    typed = (ev.is_module | ev.is_backward) & (own_module >= 0)
    kind_codes = np.full(m, FRAMEWORK_KINDS.index(schema.KIND_OP), dtype=np.int64)
    kind_codes[ev.is_module] = FRAMEWORK_KINDS.index(schema.KIND_MODULE)
    kind_codes[ev.is_backward] = FRAMEWORK_KINDS.index(schema.KIND_BACKWARD)
    kind_codes[ev.is_optimizer] = FRAMEWORK_KINDS.index(schema.KIND_OPTIMIZER)
    kind_codes[ev.is_data] = FRAMEWORK_KINDS.index(schema.KIND_DATA_LOADING)
    kind_codes[ev.is_collective] = FRAMEWORK_KINDS.index(schema.KIND_COLLECTIVE)

    mods = [infos[i] for i in own_module[module_rows]]
    calls = layers.call.tolist()
    per_call = np.full(m, -1, dtype=np.int64)
    per_call[module_rows] = np.arange(len(module_rows))

    def module_column(texts: list[str | None]) -> pa.DictionaryArray:
        values, codes = _intern(texts)
        if not len(codes):  # a run without module calls (a functional script)
            return dictionary_column(np.full(m, -1, dtype=np.int64), values)
        return dictionary_column(
            np.where(per_call >= 0, codes[np.maximum(per_call, 0)], -1), values
        )

    base = len(rec.name.values)
    names, workers, memory = _loader_settings(rec.name.values)
    display_codes = np.where(per_call >= 0, base + own_module, ev.name_codes)
    display = dictionary_column(display_codes, names + [i.path or i.type for i in infos])
    op_codes = np.where(ev.is_module, -1, ev.name_codes)

    shape_values = rec.input_shapes.values
    shape_codes = np.frombuffer(rec.input_shapes.codes, dtype=np.int32)[ev.rows].astype(np.int64)
    empty = shape_values.index("[]") if "[]" in shape_values else -2
    shape_codes[shape_codes == empty] = -1
    call_values, call_codes = _intern([rec.call_input_shapes[c] for c in calls])
    shape_codes[module_rows] = np.where(call_codes >= 0, len(shape_values) + call_codes, -1)
    dtype_values = rec.input_dtypes.values
    dtype_codes = np.frombuffer(rec.input_dtypes.codes, dtype=np.int32)[ev.rows].astype(np.int64)
    blank = dtype_values.index("") if "" in dtype_values else -2
    dtype_codes[(dtype_codes == blank) | ev.is_module] = -1

    params = np.zeros(m, dtype=np.int64)
    params[module_rows] = [i.params for i in mods]
    out_shapes = rec.call_output_shapes
    return {
        "name": display,
        "start_ns": ev.start,
        "dur_ns": ev.end - ev.start,
        "kind": dictionary_column(kind_codes, list(FRAMEWORK_KINDS)),
        "phase": dictionary_column(layers.phase_code.astype(np.int64), list(PHASES)),
        "thread_id": ev.thread,
        "module_path": dictionary_column(layers.module, [i.path for i in infos]),
        "module_type": dictionary_column(np.where(typed, own_module, -1), [i.type for i in infos]),
        "module_params": arrow(params, pa.int64(), mask=per_call < 0),
        "op_name": dictionary_column(op_codes, names),
        "data_workers": arrow(workers[ev.name_codes], pa.int32(), mask=workers[ev.name_codes] < 0),
        "data_memory": dictionary_column(memory[ev.name_codes], ["pageable", "pinned"]),
        "input_shapes": dictionary_column(shape_codes, shape_values + call_values),
        "input_dtypes": dictionary_column(dtype_codes, dtype_values),
        "output_shapes": module_column([out_shapes.get(c) for c in calls]),
        "source": module_column([i.source for i in mods]),
        "seq_nr": arrow(ev.seq_nr, pa.int64(), mask=ev.seq_nr < 0),
        **_collective_columns(rec, ev),
    }


def _collective_columns(rec: FrameworkRecords, ev: _Events) -> dict[str, pa.Array]:
    """The operation and the bytes of each collective row (``xsp.tracer.convert.collectives``);
    null on every other row."""
    m = len(ev.rows)
    rows = np.nonzero(ev.is_collective)[0]
    if not len(rows):
        return {}
    names = [rec.name.values[c] for c in ev.name_codes[rows]]
    operations = [collectives.operation(n) or "" for n in names]
    raw = ev.rows[rows]
    shapes, dtypes = rec.input_shapes, rec.input_dtypes
    found = [
        collectives.tensor_bytes(shapes.values[shapes.codes[r]], dtypes.values[dtypes.codes[r]])
        for r in raw.tolist()
    ]
    own = np.array([-1 if b is None else b for b in found], dtype=np.int64)
    is_call = np.array([n.startswith(collectives.CALL_PREFIX) for n in names], dtype=bool)
    sizes = collectives.pair_bytes(operations, is_call, ev.iteration[rows], ev.start[rows], own)
    values, codes = _intern(operations)
    op_codes = np.full(m, -1, dtype=np.int64)
    op_codes[rows] = codes
    size_column = np.full(m, -1, dtype=np.int64)
    size_column[rows] = sizes
    return {
        "collective": dictionary_column(op_codes, values),
        "collective_bytes": arrow(size_column, pa.int64(), mask=size_column < 0),
    }


def _loader_settings(values: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Range names without the DataLoader settings level F appends to a batch's range, with
    the workers (-1: none) and memory code (0 pageable, 1 pinned, -1 none) of each name."""
    names, workers, memory = list(values), np.full(len(values), -1), np.full(len(values), -1)
    for code, value in enumerate(values):
        if LOADER_SETTINGS_MARK in value and (found := LOADER_SETTINGS.search(value)):
            names[code] = value[: found.start()]
            workers[code] = int(found.group(1))
            memory[code] = int(found.group(2) == "True")
    return names, workers.astype(np.int64), memory.astype(np.int64)


def _intern(texts: Sequence[str | None]) -> tuple[list[str], np.ndarray]:
    """Distinct values of ``texts`` and each entry's code (-1 for None)."""
    index: dict[str, int] = {}
    codes = np.array(
        [-1 if t is None else index.setdefault(t, len(index)) for t in texts], dtype=np.int64
    )
    return list(index), codes
