"""SQL over a measurement's spans: a DuckDB connection with a ``spans`` table.

The table has every column of ``tracer.schema.SPAN_SCHEMA`` plus ``run_index`` and ``levels``
(the run the row came from). The span files are read with pyarrow, so a corrupt or truncated file
is reported by name, and kept in memory as Arrow, which DuckDB scans in place.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema
from xsp.core.columns import arrow, numbers, scalar
from xsp.core.errors import StoreError
from xsp.core.intervals import break_cycles, find_rows
from xsp.core.store import SPAN_FILE_PATTERN, Run, open_measurement

__all__ = [
    "MeasurementStore",
    "arrow_of",
    "parent_rows",
    "text_codes",
    "text_equals",
    "text_in",
    "text_matches",
    "texts",
]

# from_batches: Schema.empty_table() imports pandas (0.25 s), which opening a store needs not
_EMPTY = pa.Table.from_batches(
    [],
    pa.schema(
        [*schema.SPAN_SCHEMA, pa.field("run_index", pa.int32()), pa.field("levels", pa.string())]
    ),
)


class MeasurementStore:
    """The runs of one measurement directory, queryable with SQL.

    ``runs`` are the timing runs (M, MF, MFL, MFLG, ...), whose spans the ``spans`` table holds;
    the hardware-counter run (MH), whose step times are those of kernel replay, is kept apart in
    ``counter_runs``: only its counter tables join the analyses (``xsp.analysis.tables.counters``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        #: What the store's reader left out or guessed (a missing level set, no manifest).
        self.warnings: list[str] = []
        every = open_measurement(self.root, self.warnings.append)
        self.counter_runs: list[Run] = [r for r in every if r.is_counter_run]
        # a measurement of counters alone keeps its counter run as the timing run too
        self.runs: list[Run] = [r for r in every if not r.is_counter_run] or every
        #: Values derived from the spans, kept by their declarations (``xsp.analysis.measurement.derived``).
        self.derived_values: dict[tuple[str, Hashable], object] = {}
        self._parents: list[np.ndarray] = []  # each run's parent rows, found at open
        tables = []
        # each run's own table: the combined table's chunks are these columns, shared, so a
        # run's spans cost nothing more (filtering them out of 1.5M rows took 0.7 s a run)
        self._run_tables: list[pa.Table] = []
        for index, run in enumerate(self.runs):
            spans = run.spans()  # raises StoreError naming a corrupt or truncated file
            spans = self._without_cycles(index, run, spans)
            self._run_tables.append(spans)
            n = spans.num_rows
            spans = spans.append_column("run_index", arrow(np.full(n, index, np.int32)))
            levels = pa.DictionaryArray.from_arrays(
                arrow(np.zeros(n, np.int32)), arrow([run.levels], pa.string())
            ).cast(pa.string())  # n copies of one string without a Python list of them
            tables.append(spans.append_column("levels", levels))
        # Arrow in memory, scanned by DuckDB in place: an analysis runs dozens of queries, and
        # re-reading Parquet for each cost ~60 ms a query on a 100k-span store.
        self.table = pa.concat_tables(tables) if tables else _EMPTY
        self.con = duckdb.connect()
        self.con.register("spans", self.table)

    def _without_cycles(self, index: int, run: Run, spans: pa.Table) -> pa.Table:
        """The run's spans with each span on a cycle of parent ids (its own parent, or its
        parent's ancestor) read as a root, said in ``warnings``: every walk up the tree, in
        numpy or by the spans' ids, then ends at a root. Its parent rows are kept (``parents``)."""
        parent, on_cycle = break_cycles(parent_rows(spans))
        self._parents.append(parent)
        if not len(on_cycle):
            return spans
        self.warnings.append(
            f"{run.path}: {len(on_cycle)} spans are their own ancestors (a cycle of parent "
            f"ids); each is read as a root"
        )
        ids = numbers(spans.column("parent_span_id")).astype(np.uint64)
        ids[on_cycle] = 0
        at = spans.schema.get_field_index("parent_span_id")
        return spans.set_column(at, spans.field(at), arrow(ids, pa.uint64()))

    def parents(self, index: int) -> np.ndarray:
        """Each span's parent row in run ``index``'s spans (-1: a root), found once at open."""
        return self._parents[index]

    def require_spans(self) -> None:
        """Raise StoreError naming the first level-set run without spans (no span files, or
        files that hold none): a reconstruction needs spans from every run it joins."""
        counts = np.bincount(
            np.asarray(self.table.column("run_index"), dtype=np.int64), minlength=len(self.runs)
        )
        for run, count in zip(self.runs, counts, strict=True):
            if not run.span_files:
                meta = run.document
                status = meta.status.value if meta.status is not None else None
                why = meta.error or ", ".join(meta.status_reasons or ())
                raise StoreError(
                    f"{run.path}: no span files ({SPAN_FILE_PATTERN}); its run.json says "
                    f"status {status!r}" + (f" ({why})" if why else "")
                )
            if not count:
                said = run.document.spans
                raise StoreError(
                    f"{run.path}: its span files hold no spans"
                    + (f" (its run.json says {said})" if said else "")
                    + f"; read the other level sets alone (xsp export {self.root}/<levels>)"
                )

    def run_spans(self, index: int) -> pa.Table:
        """The spans of run ``index`` (schema.SPAN_SCHEMA columns)."""
        return self._run_tables[index]

    def sql(self, query: str, params: list[Any] | None = None) -> pa.Table:
        try:
            return arrow_of(self.con.sql(query, params=params or None))
        except duckdb.Error as exc:
            raise StoreError(f"{self.root}: query failed ({exc})") from exc

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for run in self.runs for p in run.span_files)


def arrow_of(relation: duckdb.DuckDBPyRelation) -> pa.Table:
    """A DuckDB query's result as an arrow table (DuckDB 2 renamed ``Relation.arrow()`` to
    ``to_arrow_table()``)."""
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
    table: pa.Table = fetch()
    return table


def parent_rows(table: pa.Table) -> np.ndarray:
    """Each span's parent row in ``table`` (-1: a root, or a parent not in it)."""
    span_id = numbers(table.column("span_id")).astype(np.uint64, copy=False).astype(np.int64)
    parent_id = (
        numbers(table.column("parent_span_id")).astype(np.uint64, copy=False).astype(np.int64)
    )
    return find_rows(span_id, parent_id)  # span ids start at 1: roots (0) find none


def texts(column: pa.ChunkedArray | pa.Array, null: str | None = "") -> np.ndarray:
    """A text column as a numpy object array, ``null`` for nulls, as ``np.asarray(column.cast(
    pa.string()).fill_null(""), dtype=object)`` gives it, but with equal values sharing one str:
    8 bytes a row rather than a string object each (about 60: 180 MB for three columns of a
    1M-span run)."""
    chunks = [column] if isinstance(column, pa.Array) else column.chunks
    parts = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.cast(pa.string()).dictionary_encode()
        distinct = chunk.dictionary.cast(pa.string()).to_pylist()
        values = np.array([*(v if v is not None else null for v in distinct), null], dtype=object)
        rows = numbers(chunk.indices, null=len(values) - 1).astype(np.int64, copy=False)
        parts.append(values[rows])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=object)


def text_matches(
    column: pa.ChunkedArray | pa.Array, test: Callable[[pa.Array], pa.Array]
) -> np.ndarray:
    """Each row of a text column where ``test`` (a pyarrow compute function on strings) holds,
    False for nulls, ``test`` run once per distinct text: casting a 1M-row dictionary column to
    strings to test it took 0.6 s."""
    chunks = [column] if isinstance(column, pa.Array) else column.chunks
    parts = [np.zeros(0, dtype=bool)]
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.cast(pa.string()).dictionary_encode()
        found = test(chunk.dictionary.cast(pa.string()))
        hits = np.append(numbers(found, null=False).astype(bool, copy=False), False)  # a null's
        rows = numbers(chunk.indices, null=len(hits) - 1).astype(np.int64, copy=False)
        parts.append(hits[rows])
    return np.concatenate(parts)


def text_equals(column: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    """Each row of a text column that holds ``value`` (``text_matches`` with equality)."""
    wanted = scalar(value, pa.string())  # a Python value would import pandas (pyarrow's)
    return text_matches(column, lambda texts: pc.equal(texts, wanted))


def text_in(column: pa.ChunkedArray | pa.Array, values: Iterable[str]) -> np.ndarray:
    """Each row of a text column that holds one of ``values``."""
    value_set = arrow(sorted(values), pa.string())
    return text_matches(column, lambda texts: pc.is_in(texts, value_set=value_set))


def text_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """A text column as (a code per row, the texts): equal texts share a code, a null is -1;
    decoded once per distinct text, for grouping rows by text in numpy."""
    chunks = [column] if isinstance(column, pa.Array) else column.chunks
    found: dict[str, int] = {}
    parts = [np.zeros(0, dtype=np.int64)]
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.cast(pa.string()).dictionary_encode()
        distinct = chunk.dictionary.cast(pa.string()).to_pylist()
        local = np.array(
            [-1 if v is None else found.setdefault(v, len(found)) for v in distinct] + [-1],
            dtype=np.int64,
        )
        rows = numbers(chunk.indices, null=len(local) - 1).astype(np.int64, copy=False)
        parts.append(local[rows])
    return np.concatenate(parts), list(found)
