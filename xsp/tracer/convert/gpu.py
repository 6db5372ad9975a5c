"""Level G's conversion: kernels, copies and sets under the API call that launched them (CUPTI
correlation id), with that call's layer and phase. The columns come from
``xsp.tracer.convert.cuda``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.records import GpuRecords, GraphNodes, StepRecords
from xsp.tracer.convert import compiled, graphs
from xsp.tracer.convert.cuda import gpu_columns
from xsp.tracer.convert.table import INHERITED, Block, Placed, SpanTable, arrow_of, ids_of, take

__all__ = ["convert_gpu"]


def convert_gpu(table: SpanTable, gpu: GpuRecords) -> None:
    """Level G: GPU work under the API call that launched it."""
    _gpu_block(table, gpu, table.steps, table.launches, table.kernel_sources)


def _graph_kernels(table: SpanTable, gpu: GpuRecords, kept: np.ndarray, columns: dict) -> None:
    """Kernels replayed from a CUDA graph take the layer and phase of the op that made their
    node (``xsp.tracer.convert.graphs``)."""
    nodes = np.frombuffer(gpu.graph_node, dtype=np.int64)
    if len(nodes) != len(gpu.start_ns):  # records from before graph nodes were kept
        nodes = np.zeros(len(gpu.start_ns), dtype=np.int64)
    framework = table.framework_records
    replayed, known = graphs.attribute(
        columns,
        nodes[kept],
        framework.graph_nodes if framework is not None else GraphNodes(),
        framework.modules if framework is not None else [],
        framework.extern_calls if framework is not None else [],
    )
    table.report.graph_kernels += replayed
    table.report.graph_kernels_attributed += known


def _gpu_block(
    table: SpanTable,
    gpu: GpuRecords,
    steps: StepRecords,
    launches: Placed,
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
            columns[name] = take(launches.block.columns[name], api_row)
    _graph_kernels(table, gpu, kept, columns)
    if sources and "module_path" in columns:
        launch_parents = launches.block.foreign_parent
        regions = ids_of(launch_parents, api_row) if launch_parents is not None else api_row
        columns["module_path"] = compiled.attribute(
            columns["module_path"],
            arrow_of(columns["name"]).cast(pa.string()).to_pylist(),
            arrow_of(columns["phase"]).cast(pa.string()).to_pylist(),
            regions,
            np.asarray(columns["start_ns"]),  # gpu_columns': numpy already (no copy)
            sources,
        )
    block = Block(
        schema.LEVEL_GPU,
        iteration.astype(np.int32),
        np.full(len(kept), -1),
        columns,
        ids_of(launches.ids, api_row),
    )
    table.add(block)
