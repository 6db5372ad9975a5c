"""A campaign directory: the campaign file's contents, one result file per finished job, one run
directory per job, and SQL over all of it.

::

    DIR/campaign.json           the spec the campaign runs (a rerun must match it)
    DIR/jobs/<job>.json         the job's result: status, reason, wall time, summary
    DIR/runs/<job>/             the job's leveled measurement (xsp run's store)
    DIR/staging/<job>/<try>/    a Ray job's measurement while it runs (``stage``, ``commit``)
    DIR/report.html             ``xsp campaign report``
    DIR/reports/<job>.html      the job's run's own report (``run_reports``)

A job without a result file has not finished: a rerun runs it again. A job whose result says
failed is retried; a job that succeeded is skipped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import duckdb
import pyarrow as pa

from xsp.campaign.records import JobRecord
from xsp.campaign.spec import CampaignRecord, CampaignSpec, Job, from_record
from xsp.campaign.summary import shares_text
from xsp.core import schema
from xsp.core import store as run_store
from xsp.core.errors import ConfigError, StoreError

__all__ = ["JOB_COLUMNS", "SPEC_FILE", "CampaignStore", "FlatRow"]

SPEC_FILE = "campaign.json"


class CampaignStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs_dir = root / "jobs"
        self.runs_dir = root / "runs"
        self.staging_dir = root / "staging"

    # -- state -----------------------------------------------------------------------------
    def begin(self, spec: CampaignSpec) -> None:
        """Create the directory, or check that a rerun uses the same campaign."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        path = self.root / SPEC_FILE
        if path.exists():
            previous = run_store.read_json(path)
            if previous != json.loads(json.dumps(spec.to_dict())):
                raise ConfigError(
                    f"{self.root} holds a different campaign ({previous.get('name')!r}); "
                    "use a new --out directory"
                )
        else:
            run_store.write_json_atomic(path, spec.to_dict())

    def spec(self) -> CampaignSpec:
        path = self.root / SPEC_FILE
        if not path.exists():
            raise StoreError(f"{self.root}: not a campaign directory (no {SPEC_FILE})")
        return from_record(cast(CampaignRecord, run_store.read_json(path)))

    def result(self, job: Job) -> JobRecord | None:
        path = self.jobs_dir / f"{job.id}.json"
        return _job_record(path) if path.exists() else None

    def pending(self, jobs: list[Job]) -> list[Job]:
        """Jobs without a successful result: never run, interrupted, or failed (retried)."""
        return [j for j in jobs if (r := self.result(j)) is None or r.get("status") != "ok"]

    def save(self, record: JobRecord) -> None:
        run_store.write_json_atomic(self.jobs_dir / f"{record['job']}.json", record)

    def run_dir(self, job: Job) -> Path:
        return self.runs_dir / job.id

    # -- staging: a Ray job's measurement is written aside, then put in place whole ----------
    def stage(self, job: Job, attempt: str) -> Path:
        """A new directory for one attempt at ``job`` (``attempt``: unique to it), on the runs'
        file system: a node that dies mid-job leaves it here, never half a run directory."""
        path = self.staging_dir / job.id / attempt
        path.mkdir(parents=True)
        return path

    def attempts(self, job: Job) -> list[Path]:
        """The staging directories of ``job``'s attempts since the driver last cleared them."""
        folder = self.staging_dir / job.id
        return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []

    def commit(self, job: Job, staged: Path) -> None:
        """Put a finished attempt in place as the job's run directory, replacing an earlier
        attempt's. An attempt that wrote nothing (refused before it ran) replaces nothing."""
        if any(staged.iterdir()):
            run_store.commit_dir(staged, self.run_dir(job))

    def clear_staging(self, job: Job) -> None:
        """Drop what ``job``'s attempts left aside (the one that finished has moved)."""
        shutil.rmtree(self.staging_dir / job.id, ignore_errors=True)

    def results(self) -> list[JobRecord]:
        return [_job_record(p) for p in sorted(self.jobs_dir.glob("*.json"))]

    # -- SQL -------------------------------------------------------------------------------
    def connect(self) -> duckdb.DuckDBPyConnection:
        """DuckDB with two tables: ``jobs`` (one row per job result, summary flattened) and
        ``spans`` (every span of every job's runs, with its job id, model, mode and batch).
        A damaged span file (``tracer.store.read_span_file``) is a StoreError naming it."""
        con = duckdb.connect()
        con.register("jobs", _jobs_table([_flatten(r) for r in self.results()]))
        files = sorted(self.runs_dir.glob("*/*/spans-*.parquet"))
        if not files:  # no run stored a span yet: the same columns, no rows
            empty = schema.SPAN_SCHEMA.empty_table()
            for name, type_ in (("job", pa.string()), ("levels", pa.string())):
                empty = empty.append_column(name, pa.array([], type_))
            con.register("spans_stored", empty)
            con.execute(
                "CREATE VIEW spans AS SELECT s.*, jobs.model, jobs.mode, jobs.batch_size "
                "FROM spans_stored AS s LEFT JOIN jobs USING (job)"
            )
        else:
            for path in files:  # DuckDB verifies no checksum nor value: a damaged file stops here
                run_store.read_span_file(path)
            listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
            con.execute(
                f"""CREATE VIEW spans AS SELECT s.*, jobs.model, jobs.mode, jobs.batch_size
                    FROM (SELECT *, split_part(parse_dirpath(filename), '/', -2) AS job,
                                 split_part(parse_dirpath(filename), '/', -1) AS levels
                          FROM read_parquet([{listing}], union_by_name = true, filename = true))
                         AS s LEFT JOIN jobs USING (job)"""
            )
        return con


def _job_record(path: Path) -> JobRecord:
    """A job's result file, as ``jobs.run_job`` wrote it."""
    return cast(JobRecord, run_store.read_json(path))


#: The ``jobs`` table's columns that are there even before any job has a result or a summary.
JOB_COLUMNS = (
    "job",
    "model",
    "mode",
    "batch_size",
    "status",
    "reason",
    "error",
    "wall_s",
    "latency_ms",
    "throughput_per_s",
    "gpu_busy_pct",
    "median_kernel_us",
    "bound",
)
#: The documented columns' types; the others' are what pyarrow finds in the records.
_JOB_TYPES = {
    "batch_size": pa.int64(),
    "wall_s": pa.float64(),
    "latency_ms": pa.float64(),
    "throughput_per_s": pa.float64(),
    "gpu_busy_pct": pa.float64(),
    "median_kernel_us": pa.float64(),
}


#: A job result as one flat row: open keys, whatever a summary holds (``_flatten``).
FlatRow = dict[str, object]


def _jobs_table(rows: list[FlatRow]) -> pa.Table:
    """One row per job result: the documented columns first and always (so a query runs when
    no job got that far), then every other key a result has; a column no row fills is text."""
    columns = list(dict.fromkeys([*JOB_COLUMNS, *(k for row in rows for k in row)]))
    if not rows:
        return pa.schema(
            [pa.field(c, _JOB_TYPES.get(c, pa.string())) for c in columns]
        ).empty_table()
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    for index, field in enumerate(table.schema):
        wanted = _JOB_TYPES.get(field.name, pa.string() if pa.types.is_null(field.type) else None)
        if wanted is not None and wanted != field.type:  # only these: casting nested ones fails
            table = table.set_column(index, field.name, table.column(index).cast(wanted))
    return table


def _flatten(record: JobRecord) -> FlatRow:
    """A job result as one flat row (summary keys become columns; lists become text)."""
    row: FlatRow = {k: v for k, v in record.items() if k != "summary"}
    for key, value in (record.get("summary") or {}).items():
        if isinstance(value, dict):
            for inner, item in value.items():  # nested tables (a counter run's roofs) as JSON
                row[f"{key}_{inner}"] = json.dumps(item) if isinstance(item, dict) else item
        elif isinstance(value, list):
            row[key] = shares_text(value)
        else:
            row[key] = value
    return row
