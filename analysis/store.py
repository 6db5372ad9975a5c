"""SQL over a measurement's span files: a DuckDB connection with a ``spans`` view.

The view has every column of ``tracer.schema.SPAN_SCHEMA`` plus ``levels`` (the level set of the
run the row came from). Files are checked with pyarrow first so that a corrupt or truncated file
is reported by name instead of as a query error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracer import schema
from tracer.errors import StoreError
from tracer.store import Run, open_measurement


def _columns_of(path: Path) -> set[str]:
    """The file's column names; reading the footer also validates the file."""
    try:
        return set(pq.ParquetFile(path).schema_arrow.names)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{path}: corrupt or truncated span file ({exc})") from exc


def _sql_type(type_: pa.DataType) -> str:
    if pa.types.is_dictionary(type_) or pa.types.is_string(type_):
        return "VARCHAR"
    if pa.types.is_binary(type_) or pa.types.is_fixed_size_binary(type_):
        return "BLOB"
    if pa.types.is_floating(type_):
        return "DOUBLE"
    return {pa.uint64(): "UBIGINT", pa.int32(): "INTEGER"}.get(type_, "BIGINT")


def _select_list(present: set[str]) -> str:
    """Every schema column, NULL where files written before that column existed lack it."""
    return ", ".join(
        f.name if f.name in present else f"NULL::{_sql_type(f.type)} AS {f.name}"
        for f in schema.SPAN_SCHEMA
    )


class MeasurementStore:
    """The runs of one measurement directory, queryable with SQL."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.runs: list[Run] = open_measurement(self.root)
        self.con = duckdb.connect()
        selects = []
        for index, run in enumerate(self.runs):
            files = run.span_files
            present: set[str] = set()
            for path in files:
                present |= _columns_of(path)
            if not files:
                continue
            listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
            selects.append(
                f"SELECT {_select_list(present)}, {index} AS run_index, '{run.levels}' AS levels "
                f"FROM read_parquet([{listing}], union_by_name = true)"
            )
        if selects:
            sql = " UNION ALL BY NAME ".join(selects)
        else:
            sql = "SELECT NULL::VARCHAR AS levels, NULL::VARCHAR AS kind WHERE false"
        try:
            self.con.execute(f"CREATE VIEW spans AS {sql}")
        except duckdb.Error as exc:
            raise StoreError(f"{self.root}: cannot read span files ({exc})") from exc

    def sql(self, query: str, params: list[Any] | None = None) -> pa.Table:
        try:
            relation = self.con.sql(query, params=params or None)
            # DuckDB 2 renamed Relation.arrow() to to_arrow_table().
            fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
            return fetch()
        except duckdb.Error as exc:
            raise StoreError(f"{self.root}: query failed ({exc})") from exc

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for run in self.runs for p in run.span_files)
