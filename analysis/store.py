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

from tracer.errors import StoreError
from tracer.store import Run, open_measurement


def _check_file(path: Path) -> None:
    try:
        pq.ParquetFile(path).metadata  # noqa: B018 - reading the footer validates the file
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{path}: corrupt or truncated span file ({exc})") from exc


class MeasurementStore:
    """The runs of one measurement directory, queryable with SQL."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.runs: list[Run] = open_measurement(self.root)
        self.con = duckdb.connect()
        selects = []
        for index, run in enumerate(self.runs):
            files = run.span_files
            for path in files:
                _check_file(path)
            if not files:
                continue
            listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
            selects.append(
                f"SELECT *, {index} AS run_index, '{run.levels}' AS levels "
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
