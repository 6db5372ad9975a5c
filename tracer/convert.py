"""Raw level records -> one span table (pure functions, no torch, no I/O).

Each level's raw records become a block of rows with local parent links; ``build_table`` stacks
the blocks, gives every row a span id, turns local links into span ids and hangs each level's
top-level rows under the model span of their iteration. Hierarchy comes from recorded nesting and
ids (profiler range nesting on a thread, autograd sequence numbers), never from names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema
from tracer.intervals import depths, inherit, nest
from tracer.levels.framework import MODULE_RANGE_PREFIX, STEP_RANGE_PREFIX, FrameworkRecords
from tracer.levels.model import StepRecords

BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
OPTIMIZER_PREFIX = "Optimizer."
STEP_SPAN_NAME = "step"


@dataclass
class ConversionReport:
    """What conversion kept and what it left out, for the run's manifest."""

    spans: int = 0
    events_outside_iterations: int = 0
    counts_by_level: dict[str, int] = field(default_factory=dict)


@dataclass
class _Block:
    """Rows of one level; ``parent`` indexes rows of the same block, -1 for top-level rows."""

    level: str
    iteration: np.ndarray
    parent: np.ndarray
    columns: dict[str, Any]

    def __len__(self) -> int:
        return len(self.iteration)


def build_table(
    run_id: str,
    levels: str,
    steps: StepRecords,
    framework: FrameworkRecords | None = None,
    failures: dict[int, str] | None = None,
) -> tuple[pa.Table, ConversionReport]:
    """Turn one run's raw records into a span table that follows ``schema.SPAN_SCHEMA``.

    ``failures`` maps an iteration to the error that ended it; its model span gets that status.
    Rows of deeper levels whose iteration has no model span (the run stopped inside it) are kept
    under no parent only if M recorded nothing at all; otherwise they are counted and left out.
    """
    report = ConversionReport()
    blocks = [_step_block(steps, failures or {})]
    if framework is not None:
        block, outside = _framework_block(framework)
        report.events_outside_iterations += outside
        blocks.append(block)

    step_rows = {int(it): row for row, it in enumerate(blocks[0].iteration)}
    tables = []
    next_id = 1
    for block in blocks:
        n = len(block)
        ids = np.arange(next_id, next_id + n, dtype=np.uint64)
        next_id += n
        if block.level == schema.LEVEL_MODEL:
            parent_ids = np.zeros(n, dtype=np.uint64)
        else:
            # Top-level rows of a deeper level hang under their iteration's model span.
            step_of = _lookup(step_rows, block.iteration)
            keep = (block.parent >= 0) | (step_of >= 0)
            local_parent = np.where(block.parent >= 0, ids[np.maximum(block.parent, 0)], 0)
            top_parent = np.where(step_of >= 0, np.maximum(step_of, 0) + 1, 0).astype(np.uint64)
            parent_ids = np.where(block.parent >= 0, local_parent, top_parent).astype(np.uint64)
            if not keep.all():  # pragma: no cover - M always records the iterations F sees
                report.events_outside_iterations += int((~keep).sum())
        tables.append(_block_table(run_id, levels, block, ids, parent_ids))
        report.counts_by_level[block.level] = n
    table = pa.concat_tables(tables, promote_options="permissive").cast(schema.SPAN_SCHEMA)
    report.spans = table.num_rows
    return table, report


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
    # String work stays in arrow (C speed): conversion must keep up with ~1M spans/s.
    names = pa.array(rec.name, pa.string())
    start = np.asarray(rec.start_ns, dtype=np.int64)
    end = np.asarray(rec.end_ns, dtype=np.int64)
    thread = np.asarray(rec.thread, dtype=np.int64)
    n = len(names)

    def starts(prefix: str) -> np.ndarray:
        return pc.starts_with(names, prefix).to_numpy(zero_copy_only=False)

    def suffix_ints(rows: np.ndarray, prefix: str) -> np.ndarray:
        picked = pc.utf8_slice_codeunits(names.take(pa.array(rows, pa.int64())), len(prefix))
        return pc.cast(picked, pa.int64()).to_numpy(zero_copy_only=False)

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
    step_iter = suffix_ints(order, STEP_RANGE_PREFIX).astype(np.int32)
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
    take = pa.array(rows, pa.int64())
    parent = parent[rows]
    outside = int((~inside & ~is_step).sum())

    names = names.take(take)
    start, end, thread = start[rows], end[rows], thread[rows]
    is_module, is_backward, is_optimizer = is_module[rows], is_backward[rows], is_optimizer[rows]
    seq_nr = np.asarray(rec.seq_nr, dtype=np.int64)[rows]
    fwd_thread = np.asarray(rec.fwd_thread, dtype=np.int64)[rows]
    depth = depths(parent)
    m = len(rows)

    # Module of each row: its own for module ranges, else inherited from the nearest ancestor.
    module_rows = np.nonzero(is_module)[0]
    call = suffix_ints(module_rows, MODULE_RANGE_PREFIX)
    call_module = np.asarray(rec.call_module, dtype=np.int64)
    own_module = np.full(m, -1, dtype=np.int64)
    own_module[module_rows] = call_module[call]

    phase_code = np.full(m, -1, dtype=np.int8)  # 0 forward, 1 backward, 2 optimizer
    phase_code[is_backward] = 1
    phase_code[is_optimizer] = 2
    phase_code[(parent < 0) & (phase_code < 0)] = 0
    phase_code = inherit(phase_code, parent, depth)
    module = inherit(own_module, parent, depth)

    # Backward attribution: an autograd node carries the sequence number of the forward op that
    # created it; that op ran inside a module on the forward thread.
    forward_ops = np.nonzero((phase_code == 0) & (seq_nr >= 0) & (module >= 0) & ~is_module)[0]
    by_seq = dict(
        zip(
            zip(thread[forward_ops].tolist(), seq_nr[forward_ops].tolist(), strict=False),
            module[forward_ops].tolist(),
            strict=False,
        )
    )
    backward_rows = np.nonzero(is_backward)[0]
    own_module[backward_rows] = [
        by_seq.get(key, -1)
        for key in zip(
            fwd_thread[backward_rows].tolist(), seq_nr[backward_rows].tolist(), strict=False
        )
    ]
    module = inherit(own_module, parent, depth)

    infos = rec.modules
    paths = pa.array([i.path for i in infos] + [None], pa.string())
    types = pa.array([i.type for i in infos] + [None], pa.string())
    missing = len(infos)  # index of the trailing null
    module_path = paths.take(pa.array(np.where(module >= 0, module, missing)))
    typed = is_module | is_backward
    module_type = types.take(pa.array(np.where(typed & (own_module >= 0), own_module, missing)))

    kind_codes = np.zeros(m, dtype=np.int32)
    kind_codes[is_module] = 1
    kind_codes[is_backward] = 2
    kind_codes[is_optimizer] = 3
    kinds = pa.array(
        [schema.KIND_OP, schema.KIND_MODULE, schema.KIND_BACKWARD, schema.KIND_OPTIMIZER]
    )
    phases = pa.array([schema.PHASE_FORWARD, schema.PHASE_BACKWARD, "optimizer", None])

    # Per-call facts of module ranges replace the op-oriented values of those rows.
    module_mask = pa.array(is_module)
    mods = [infos[i] for i in own_module[module_rows]]
    calls = call.tolist()
    display = pc.replace_with_mask(
        names, module_mask, pa.array([i.path or i.type for i in mods], pa.string())
    )
    in_shapes = pa.array(rec.input_shapes, pa.string()).take(take)
    in_shapes = pc.replace_with_mask(
        in_shapes,
        module_mask,
        pa.array([_shape_text(rec.call_input_shapes[c]) for c in calls], pa.string()),
    )
    in_shapes = pc.if_else(pc.equal(in_shapes, "[]"), pa.scalar(None, pa.string()), in_shapes)
    in_dtypes = pa.array(rec.input_dtypes, pa.string()).take(take)
    in_dtypes = pc.if_else(
        pc.or_(module_mask, pc.equal(in_dtypes, "")), pa.scalar(None, pa.string()), in_dtypes
    )
    out_text = [
        _shape_text(rec.call_output_shapes[c]) if c in rec.call_output_shapes else None
        for c in calls
    ]
    null_strings = pa.nulls(m, pa.string())
    output_shapes = pc.replace_with_mask(null_strings, module_mask, pa.array(out_text, pa.string()))
    source = pc.replace_with_mask(
        null_strings, module_mask, pa.array([i.source for i in mods], pa.string())
    )
    params = pc.replace_with_mask(
        pa.nulls(m, pa.int64()), module_mask, pa.array([i.params for i in mods], pa.int64())
    )
    op_name = pc.if_else(module_mask, pa.scalar(None, pa.string()), names)

    block = _Block(
        level=schema.LEVEL_FRAMEWORK,
        iteration=iteration[rows].astype(np.int32),
        parent=parent,
        columns={
            "name": display,
            "start_ns": start,
            "dur_ns": end - start,
            "kind": pa.DictionaryArray.from_arrays(pa.array(kind_codes), kinds),
            "phase": phases.take(
                pa.array(np.where(phase_code >= 0, phase_code, 3).astype(np.int64))
            ),
            "thread_id": thread,
            "module_path": module_path,
            "module_type": module_type,
            "module_params": params,
            "op_name": op_name,
            "input_shapes": in_shapes,
            "input_dtypes": in_dtypes,
            "output_shapes": output_shapes,
            "source": source,
            "seq_nr": pa.array(seq_nr, pa.int64(), mask=seq_nr < 0),
        },
    )
    return block, outside


def _shape_text(shapes: tuple[Any, ...]) -> str:
    return str([list(s) for s in shapes]).replace(" ", "")
