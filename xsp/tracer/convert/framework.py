"""Level F's conversion: module calls, aten ops, autograd nodes, optimizer calls, data loading
and collectives, nested by their recorded ranges and attributed to layers and phases.

Hierarchy comes from recorded nesting and ids (profiler range nesting on a thread, autograd
sequence numbers), never from names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import collectives, schema
from xsp.core.columns import arrow, dictionary_column, numbers
from xsp.core.intervals import depths, inherit, nest
from xsp.core.records import (
    BACKWARD_PREFIX,
    LOADER_SETTINGS,
    LOADER_SETTINGS_MARK,
    MODULE_RANGE_PREFIX,
    STEP_RANGE_PREFIX,
    FrameworkRecords,
)
from xsp.tracer.convert import compiled
from xsp.tracer.convert.shapes import copy_first_iterations_shapes
from xsp.tracer.convert.table import Block, BlockColumns, Placed, SpanTable, arrow_of

__all__ = [
    "DATA_LOADER_PREFIX",
    "FORWARD",
    "FRAMEWORK_KINDS",
    "OPTIMIZER_PREFIX",
    "PHASES",
    "convert_framework",
]

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


def convert_framework(table: SpanTable, framework: FrameworkRecords) -> None:
    """Level F: module calls, ops, autograd nodes and optimizer calls, nested by their ranges."""
    block, outside, without_shapes = _framework_block(framework)
    table.report.events_outside_iterations += outside
    table.report.iterations_without_op_shapes = without_shapes
    table.framework = Placed(block, table.add(block))
    table.kernel_sources = framework.kernel_sources
    table.framework_records = framework


def _framework_block(rec: FrameworkRecords) -> tuple[Block, int, int]:
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
    if rec.kernel_sources or rec.extern_calls:
        columns["module_path"] = _compiled_sources(rec, events, columns)
    block = Block(
        level=schema.LEVEL_FRAMEWORK,
        iteration=events.iteration,
        parent=events.parent,
        columns=columns,
        external_id=external[events.rows] if len(external) == len(rec.start_ns) else None,
    )
    return block, events.outside, without_shapes


def _compiled_sources(rec: FrameworkRecords, ev: _Events, columns: BlockColumns) -> pa.Array:
    """The module paths with compiled code's work at its source modules: generated kernels
    (profiler ranges on CPU) and extern ops, with what ran inside them."""
    before = columns["module_path"]
    names = arrow_of(columns["op_name"]).cast(pa.string()).to_pylist()
    phases = arrow_of(columns["phase"]).cast(pa.string()).to_pylist()
    paths = compiled.attribute(before, names, phases, ev.parent, ev.start, rec.kernel_sources)
    if rec.extern_calls:
        in_region = np.zeros(len(ev.parent), dtype=bool)
        inside = ev.parent >= 0
        in_region[inside] = ev.is_compiled_region[ev.parent[inside]]
        frames = _compile_ids(rec, ev)
        paths = compiled.attribute_calls(
            paths, names, phases, ev.parent, in_region, frames, ev.start, rec.extern_calls
        )
    return compiled.pass_down(before, paths, ev.parent)


def _compile_ids(rec: FrameworkRecords, ev: _Events) -> list[str | None]:
    """The dynamo compile id of the compiled frame each event ran in: a forward event's from
    its innermost ``Torch-Compiled Region: <id>`` range, a backward node's from the forward op
    that created it (autograd sequence numbers), and what runs inside either inherits it."""
    prefix = compiled.FRAME_PREFIX
    ids = [v[len(prefix) :] if v.startswith(prefix) else None for v in rec.name.values]
    frames = sorted({i for i in ids if i is not None})
    slot = np.array([frames.index(i) if i is not None else -1 for i in ids], dtype=np.int64)
    own = slot[ev.name_codes] if len(ids) else np.full(len(ev.rows), -1, dtype=np.int64)
    depth = depths(ev.parent)
    frame = inherit(own, ev.parent, depth)
    forward = np.nonzero((frame >= 0) & (ev.seq_nr >= 0) & ~ev.is_backward)[0]
    created_in = dict(
        zip(
            zip(ev.thread[forward].tolist(), ev.seq_nr[forward].tolist(), strict=True),
            frame[forward].tolist(),
            strict=True,
        )
    )
    backward = np.nonzero(ev.is_backward & (frame < 0))[0]
    keys = zip(ev.fwd_thread[backward].tolist(), ev.seq_nr[backward].tolist(), strict=True)
    own[backward] = [created_in.get(key, -1) for key in keys]
    frame = inherit(own, ev.parent, depth)
    return [frames[f] if f >= 0 else None for f in frame.tolist()]


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
    is_compiled_region: np.ndarray  # a run of a compiled graph's wrapper code
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
        is_compiled_region=np.logical_or.reduce(
            [starts(p)[rows] for p in compiled.REGION_PREFIXES]
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


def _framework_columns(rec: FrameworkRecords, ev: _Events, layers: _Layers) -> BlockColumns:
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

    def module_codes(texts: list[str | None]) -> tuple[np.ndarray, list[str]]:
        """Each row's code into the distinct texts of its module call (-1: not a call)."""
        values, codes = _intern(texts)
        if not len(codes):  # a run without module calls (a functional script)
            return np.full(m, -1, dtype=np.int64), values
        return np.where(per_call >= 0, codes[np.maximum(per_call, 0)], -1), values

    def module_column(texts: list[str | None]) -> pa.DictionaryArray:
        return dictionary_column(*module_codes(texts))

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
        "source": _source_column(rec, ev, *module_codes([i.source for i in mods])),
        "seq_nr": arrow(ev.seq_nr, pa.int64(), mask=ev.seq_nr < 0),
        **_collective_columns(rec, ev),
    }


def _source_column(
    rec: FrameworkRecords, ev: _Events, module_codes: np.ndarray, module_values: list[str]
) -> pa.DictionaryArray:
    """A module call's class source (``file:line``), an op's calling Python line (``file:line
    function``, where level F recorded it): one column, null elsewhere."""
    if not len(rec.op_source):
        return dictionary_column(module_codes, module_values)
    values = rec.op_source.values
    codes = np.frombuffer(rec.op_source.codes, dtype=np.int32)[ev.rows].astype(np.int64)
    blank = values.index("") if "" in values else -2
    codes[(codes == blank) | ev.is_module] = -1
    merged = np.where(module_codes >= 0, len(values) + module_codes, codes)
    return dictionary_column(merged, values + module_values)


def _collective_columns(rec: FrameworkRecords, ev: _Events) -> dict[str, pa.Array]:
    """The operation and the bytes of each collective row (``xsp.core.collectives``);
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
