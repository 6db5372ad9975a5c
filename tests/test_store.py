from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables.summary import level_sets
from xsp.core import schema, store
from xsp.core.errors import StoreError
from xsp.tracer.convert.spans import build_table


def _write_run(root: Path, levels: str = "MF") -> Path:
    return write_run(root, levels, fixture_table("resnet18_train_cpu", levels, "run-s"))


def test_round_trip_and_sql(tmp_path: Path) -> None:
    _write_run(tmp_path)
    measurement = MeasurementStore(tmp_path)
    rows = level_sets(measurement).to_pylist()
    assert rows[0]["levels"] == "MF" and rows[0]["iterations"] == 1
    assert rows[0]["spans_per_iteration"] == 1791
    count = measurement.sql("SELECT count(*) AS n FROM spans WHERE kind = 'module'").to_pylist()
    assert count == [{"n": 76}]
    # a file's fixed cost (footer, one chunk per column) dominates at 1,791 spans
    assert measurement.bytes_on_disk() / 1791 < 40


def test_twenty_iterations_cost_under_16_bytes_a_span(tmp_path: Path) -> None:
    """The bar: torch.profiler's gzipped Chrome trace takes 16 bytes per event."""
    from benchmarks.conversion import replicate
    from tests.fixtures import from_json, load_json

    records = from_json(replicate(load_json("resnet18_train_cpu"), 20))
    table, _ = build_table("run-z", "MF", {k: records[k] for k in "MF"})
    path = store.write_span_part(tmp_path, table)
    assert path.stat().st_size / table.num_rows < 16


def test_truncated_span_file_is_named(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path)
    part = run_dir / "spans-00000.parquet"
    part.write_bytes(part.read_bytes()[:300])
    with pytest.raises(StoreError, match=r"spans-00000\.parquet: corrupt or truncated"):
        MeasurementStore(tmp_path)
    with pytest.raises(StoreError, match=r"spans-00000\.parquet: corrupt or truncated"):
        store.open_run(run_dir).spans()


def test_missing_and_malformed_runs_are_named(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such run directory"):
        store.open_measurement(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="holds no xsp run"):
        store.open_measurement(tmp_path / "empty")
    run_dir = _write_run(tmp_path / "m")
    (run_dir / store.RUN_META).write_text("{not json")
    with pytest.raises(StoreError, match=r"run\.json: not readable JSON"):
        store.open_measurement(tmp_path / "m")
    shutil.rmtree(tmp_path / "m")
    run_dir = _write_run(tmp_path / "m")
    (run_dir / store.RUN_META).write_text('{"format": "other/9"}')
    with pytest.raises(StoreError, match="unknown store format 'other/9'"):
        store.open_measurement(tmp_path / "m")


def test_unwritable_directory_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=f"cannot write to {blocker / 'run'}"):
        store.check_writable(blocker / "run")


def test_files_from_an_older_schema_still_query(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xsp.analysis.tables.monitor import monitor_summary

    run_dir = tmp_path / "M"
    run_dir.mkdir()
    old = pa.table(
        {
            "trace_id": [b"\x01" * 16],
            "span_id": pa.array([1], pa.uint64()),
            "parent_span_id": pa.array([0], pa.uint64()),
            "name": ["step"],
            "start_ns": [0],
            "dur_ns": [5],
            "kind": ["step"],
        }
    )
    pq.write_table(old, run_dir / "spans-00000.parquet")
    store.write_json_atomic(
        run_dir / store.RUN_META, {"format": schema.STORE_FORMAT, "levels": "M"}
    )
    measurement = MeasurementStore(tmp_path)
    assert level_sets(measurement).to_pylist()[0]["iterations"] == 1
    assert monitor_summary(measurement).num_rows == 0  # no monitor columns: no rows, no error
