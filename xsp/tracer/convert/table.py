"""The span table being built: blocks of rows, one level at a time, given span ids in stack order.

Each level's conversion (``xsp.tracer.convert.spans.CONVERSIONS``) turns its records into a
``Block`` of rows with local parent links and adds it to the ``SpanTable``, which gives every row a
span id, turns local links into span ids and hangs each block's top-level rows under the model span
of their iteration (or under the rows of an earlier block they name). Every row takes its
iteration's trace id: the application's, where the iteration began inside one of its
OpenTelemetry spans (``app_parents``, set by level M's conversion), else xsp's own
(``schema.trace_id_for``). Pure functions, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.columns import NullColumns, arrow, dictionary, numbers
from xsp.core.native import loaded_capture
from xsp.core.records import FrameworkRecords, MonitorSamples, StepRecords

__all__ = [
    "INHERITED",
    "Block",
    "BlockColumn",
    "BlockColumns",
    "ConversionReport",
    "Placed",
    "SpanTable",
    "arrow_of",
    "codes_of",
    "ids_of",
    "take",
]

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
    #: Kernels replayed from a CUDA graph, and those whose graph node was recorded being made
    #: (they take its op's layer and phase; the others keep the graph launch's).
    graph_kernels: int = 0
    graph_kernels_attributed: int = 0
    #: The span id the next table of the same run starts at (a continuous session's batches
    #: number their spans on from the one before).
    next_span_id: int = 1


#: A block's column: an Arrow array, a numpy array or a list, one value a row, made Arrow of its
#: column's type when the table is built.
BlockColumn: TypeAlias = pa.Array | np.ndarray | list[Any]
#: A block's columns by span column name (``schema.SPAN_SCHEMA``).
BlockColumns: TypeAlias = dict[str, BlockColumn]


@dataclass
class Block:
    """Rows of one level; ``parent`` indexes rows of the same block (-1: none there), and
    ``foreign_parent`` holds span ids of parents in earlier blocks (0: none); rows with neither
    hang under the model span of their iteration."""

    level: str
    iteration: np.ndarray
    parent: np.ndarray
    columns: BlockColumns
    foreign_parent: np.ndarray | None = None
    external_id: np.ndarray | None = None  # framework ops: their CUPTI external correlation id

    def __len__(self) -> int:
        return len(self.iteration)


@dataclass
class Placed:
    """A block already in the table, with the span ids it was given."""

    block: Block
    ids: np.ndarray

    @staticmethod
    def none() -> Placed:
        empty = Block(schema.LEVEL_LIBRARY, np.zeros(0, np.int32), np.zeros(0, np.int64), {})
        return Placed(empty, np.zeros(0, dtype=np.uint64))


class SpanTable:
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
        first_span_id: int = 1,
    ) -> None:
        self.run_id, self.levels, self.rank = run_id, levels, rank
        self.failures, self.monitor, self.world_size = failures, monitor, world_size
        self.report = ConversionReport()
        self.tables: list[pa.Table] = []
        self.next_id = schema.rank_span_id_base(rank) + first_span_id
        # level M's iterations, placed first: every other level's top rows hang under them
        self.steps = StepRecords()
        self.step_rows: dict[int, int] = {}
        self.step_ids = np.zeros(0, dtype=np.uint64)
        # iteration -> (trace id, span id) of the application span it began in (single-rank)
        self.app_parents: dict[int, tuple[bytes, int]] = {}
        # what deeper levels hang under: F's ops and compiled kernels' sources, L's API calls
        self.framework: Placed | None = None
        self.kernel_sources: dict[str, list[list[str]]] = {}
        self.framework_records: FrameworkRecords | None = None  # its module table, graph nodes
        self.launches = Placed.none()

    def add(self, block: Block) -> np.ndarray:
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
            top = ids_of(self.step_ids, step_of)
            if block.foreign_parent is not None:
                top = np.where(block.foreign_parent > 0, block.foreign_parent, top).astype(
                    np.uint64
                )
            local = np.where(block.parent >= 0, ids[np.maximum(block.parent, 0)], 0)
            parent_ids = np.where(block.parent >= 0, local, top).astype(np.uint64)
        if self.rank is not None:
            block.columns["rank"] = arrow(np.full(n, self.rank, np.int32))
        self.tables.append(self._block_table(block, ids, parent_ids))
        counts = self.report.counts_by_level
        counts[block.level] = counts.get(block.level, 0) + n
        return ids

    def trace_id(self, iteration: int) -> bytes:
        """The trace id of an iteration: its application span's, else xsp's own."""
        app = self.app_parents.get(iteration)
        return (
            app[0] if app is not None else schema.trace_id_for(self.run_id, self.levels, iteration)
        )

    def _trace_ids(self, iterations: list[int]) -> pa.Array:
        """``trace_id`` of each iteration, as an arrow column (one hash each: a service's
        exporter has one iteration a span at level M)."""
        native = loaded_capture()
        if native is None:
            data = b"".join(schema.trace_ids_for(self.run_id, self.levels, iterations))
        else:  # the same ids, hashed without the interpreter lock
            prefix = f"{self.run_id}/{self.levels}/".encode()
            data = native.trace_ids(prefix, np.asarray(iterations, dtype=np.int64))
        app = self.app_parents
        if app:  # an iteration in an application's trace takes its id
            data = b"".join(
                app[it][0] if it in app else data[16 * i : 16 * i + 16]
                for i, it in enumerate(iterations)
            )
        return pa.Array.from_buffers(pa.binary(16), len(iterations), [None, pa.py_buffer(data)])

    def _block_table(self, block: Block, ids: np.ndarray, parent_ids: np.ndarray) -> pa.Table:
        n = len(block)
        unique, position = np.unique(block.iteration, return_inverse=True)
        trace_ids = self._trace_ids(unique.tolist())
        data: BlockColumns = {
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

    def finish(self) -> tuple[pa.Table, ConversionReport]:
        table = pa.concat_tables(self.tables, promote_options="permissive")
        self.report.spans = table.num_rows
        self.report.next_span_id = self.next_id - schema.rank_span_id_base(self.rank)
        return table.cast(schema.SPAN_SCHEMA), self.report


def ids_of(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Span ids of ``rows`` of an earlier block; 0 where a row is -1."""
    if len(ids) == 0:
        return np.zeros(len(rows), dtype=np.uint64)
    return np.where(rows >= 0, ids[np.maximum(rows, 0)], 0).astype(np.uint64)


def arrow_of(column: BlockColumn) -> pa.Array:
    """A column that its block made Arrow (a dictionary column: names, kinds, layers), as such."""
    return cast(pa.Array, column)


def codes_of(column: pa.DictionaryArray) -> np.ndarray:
    """A dictionary column's codes, -1 for null."""
    return numbers(column.indices, null=-1).astype(np.int64)


def take(column: Any, rows: np.ndarray) -> pa.Array:
    """Rows of an arrow column; -1 gives null."""
    indices = arrow(np.maximum(rows, 0), pa.int64(), mask=rows < 0)
    return column.take(indices)


def _lookup(mapping: dict[int, int], keys: np.ndarray) -> np.ndarray:
    """``mapping[k]`` for each key, -1 where absent (vectorised over few distinct keys)."""
    unique, position = np.unique(keys, return_inverse=True)
    values = np.array([mapping.get(int(k), -1) for k in unique], dtype=np.int64)
    return values[position] if len(keys) else np.zeros(0, dtype=np.int64)


def _as_arrow(value: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value if value.type == type_ else value.cast(type_)
    if pa.types.is_dictionary(type_):
        encoded = dictionary(list(value))
        if encoded is None:
            encoded = arrow(value, pa.string()).dictionary_encode()
        return encoded.cast(type_)
    return arrow(value, type_)
