"""Level M's conversion: one span per measured iteration, the root of that iteration's trace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.columns import arrow, repeated
from xsp.core.records import StepRecords
from xsp.tracer.convert.monitor import summarize
from xsp.tracer.convert.table import Block, BlockColumns, SpanTable

__all__ = ["RANK_STEP_NAME", "STEP_SPAN_NAME", "convert_model"]

STEP_SPAN_NAME = schema.STEP_SPAN_NAME

#: A rank's step in a multi-rank job: named after its rank, so that Jaeger's tree reads
#: iteration -> rank 0, rank 1 and the reconstruction matches each rank's step by name.
RANK_STEP_NAME = "rank {rank}"


def convert_model(table: SpanTable, steps: StepRecords) -> None:
    """Level M: one span per iteration, with the NVML samples of its time summarized on it. An
    iteration that began inside an application's OpenTelemetry span (single-rank: a rank's step
    hangs under the iteration's root across ranks) is put in that span's trace, its model span
    a child of it on the wire (``remote_parent_span_id``)."""
    block = _step_block(steps, table.failures, table.rank, table.world_size)
    if table.rank is None and steps.app_parents:
        table.app_parents = dict(steps.app_parents)
        parents = [steps.app_parents.get(int(it)) for it in block.iteration]
        block.columns["remote_parent_span_id"] = pa.array(
            [p[1] if p is not None else None for p in parents], pa.uint64()
        )
    monitor = table.monitor
    if monitor is not None and monitor.time_ns:
        summary = summarize(monitor, list(steps.start_ns), list(steps.end_ns))
        for name in schema.MONITOR_SUMMARIES:
            block.columns[f"gpu_{name}"] = arrow(summary[name], pa.float64())
    table.steps = steps
    table.add(block)


def _step_block(
    steps: StepRecords,
    failures: dict[int, str],
    rank: int | None = None,
    world_size: int | None = None,
) -> Block:
    iteration = np.asarray(steps.iteration, dtype=np.int32)
    start = np.asarray(steps.start_ns, dtype=np.int64)
    end = np.asarray(steps.end_ns, dtype=np.int64)
    n = len(iteration)
    name = STEP_SPAN_NAME if rank is None else RANK_STEP_NAME.format(rank=rank)
    columns: BlockColumns = {
        "name": repeated(name, n),
        "start_ns": start,
        "dur_ns": end - start,
        "kind": repeated(schema.KIND_STEP, n),
    }
    if failures:  # else the column is null
        columns["status_message"] = [failures.get(it) for it in iteration.tolist()]
    if world_size is not None:
        columns["world_size"] = arrow(np.full(n, world_size, np.int32))
    return Block(
        level=schema.LEVEL_MODEL,
        iteration=iteration,
        parent=np.full(n, -1, dtype=np.int64),
        columns=columns,
    )
