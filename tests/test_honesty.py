"""Issue 12, items 9-15: run status that says what was lost, CUPTI's losses counted without a
GPU, the store readers' one-line errors and warnings, and configuration read when used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.cli import main
from xsp.core import config, store
from xsp.core.errors import ConfigError, StoreError
from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink


def _run_session(tmp_path: Path, levels: str = "M", **options: Any) -> dict[str, Any]:
    session = Session(
        levels, iterations=2, warmup=0, out=tmp_path / levels, device="cpu", **options
    )
    session.start()
    for _ in range(2):
        with session.iteration():
            pass
    meta = session.close()
    assert meta is not None
    return meta


# -- item 9: status is honest -------------------------------------------------------------------
def test_a_failed_conversion_is_an_error_with_its_reason_not_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("forced conversion failure")

    monkeypatch.setattr("xsp.tracer.export.finish.build_table", broken)
    meta = _run_session(tmp_path)
    assert meta["status"] == "error" and meta["spans"] == 0 and meta["files"] == []
    assert "conversion failed: RuntimeError: forced conversion failure" in meta["error"]
    on_disk = json.loads((tmp_path / "M" / "run.json").read_text())
    assert on_disk["status"] == "error" and on_disk["status_reasons"][0] == meta["error"]


class _FlushFails(InMemorySink):
    def force_flush(self) -> None:
        raise RuntimeError("flush refused")


def test_a_sink_whose_flush_raises_makes_the_run_partial_and_keeps_the_store(
    tmp_path: Path,
) -> None:
    meta = _run_session(tmp_path, sinks=[_FlushFails()])
    assert meta["status"] == "partial"
    assert any("_FlushFails.force_flush" in r for r in meta["status_reasons"])
    assert meta["spans"] == 2 and meta["files"] == ["spans-00000.parquet"]


def test_a_store_that_cannot_be_written_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("cannot write spans-00000.parquet: disk full")

    monkeypatch.setattr("xsp.tracer.export.sinks.store.write_span_part", refuse)
    meta = _run_session(tmp_path)
    assert meta["status"] == "error" and meta["spans"] == 0
    assert "the spans could not be stored" in meta["error"] and "disk full" in meta["error"]


class _Level:
    """A level whose drain fails, or that reports CUPTI-style losses."""

    def __init__(self, letter: str, drain_fails: bool = False, counts: Any = None) -> None:
        self.letter, self._fails, self._counts = letter, drain_fails, counts

    def enable(self) -> None: ...
    def begin_iteration(self, index: int) -> None: ...
    def end_iteration(self, index: int) -> None: ...
    def disable(self) -> None: ...

    def drain(self) -> Any:
        if self._fails:
            raise RuntimeError("drain broke")
        return None

    def counts(self) -> dict[str, Any]:
        return self._counts or {}


def test_a_failed_drain_and_cupti_losses_make_the_run_partial_with_counts(tmp_path: Path) -> None:
    session = Session("M", iterations=1, warmup=0, out=tmp_path / "M", device="cpu")
    cupti = {"dropped_records": 7, "undecodable_records": 2, "undecodable_by_kind": {"X": 2}}
    session._stack.levels += [_Level("F", drain_fails=True), _Level("G", counts={"cupti": cupti})]
    session.start()
    with session.iteration():
        pass
    meta = session.close()
    assert meta is not None and meta["status"] == "partial"
    assert meta["cupti"] == cupti
    reasons = meta["status_reasons"]
    assert "level F failed to drain: drain broke" in reasons
    assert "CUPTI dropped 7 records (buffers full)" in reasons
    assert "2 CUPTI records could not be decoded" in reasons


def test_the_finish_names_each_kind_of_capture_loss_in_one_line() -> None:
    """The losses a live session and a recovered arena share (``xsp.tracer.export.finish``)."""
    from xsp.tracer.export.finish import capture_losses

    arena = {"dropped_records": 5, "callback_errors": 2, "first_callback_error": "bad shape"}
    counts = {"ranges_left_open": 3, "arena": arena, "cupti": {"undecodable_records": 1}}
    assert capture_losses(counts) == [
        "3 ranges other threads still had open when the levels stopped were left out",
        "the capture arena was full: 5 records dropped (raise XSP_ARENA_MB)",
        "2 op records failed inside the callback (first: bad shape)",
        "1 CUPTI records could not be decoded",
    ]
    # a dead process's arena file keeps the counts but not the native core's first error
    assert capture_losses({"arena": {"callback_errors": 1}}) == [
        "1 op records failed inside the callback"
    ]
    assert capture_losses({"arena": {"dropped_records": 0}, "cupti": {}}) == []


def test_cupti_without_a_gpu_is_one_line_not_a_crash() -> None:
    from xsp.core.errors import DeviceError
    from xsp.tracer.capture.hooks.cupti import _CuptiSession

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: CUPTI starts here")
    with pytest.raises(DeviceError, match="no CUDA GPU or driver in this process"):
        _CuptiSession().start(("RUNTIME",))


def test_the_summary_shows_status_reasons_and_cupti_losses(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "MF", fixture_table("resnet18_train_cpu", "MF", "run-s"))
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(
        status="partial",
        status_reasons=["a sink failed: OtlpSink.export: refused"],
        cupti={"dropped_records": 12, "undecodable_records": 3},
    )
    (run_dir / "run.json").write_text(json.dumps(meta))
    done = CliRunner().invoke(main, ["summary", str(tmp_path)])
    assert done.exit_code == 0, done.output
    said = " ".join(done.stdout.split())  # beside the summary, wrapped at the width
    assert "level set MF: partial: a sink failed: OtlpSink.export: refused" in said
    assert "CUPTI dropped 12 records" in said
    assert "3 CUPTI records could not be decoded" in said


# -- item 13: the store readers ----------------------------------------------------------------
def _one_run(tmp_path: Path) -> Path:
    return write_run(tmp_path, "MF", fixture_table("resnet18_train_cpu", "MF", "run-s"))


def _cli_error(args: list[str]) -> str:
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2, (done.exit_code, done.output, done.exception)
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("xsp: error:"), done.stderr
    assert "Traceback" not in done.output
    return lines[-1]


def test_a_span_column_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    run_dir = _one_run(tmp_path)
    part = run_dir / "spans-00000.parquet"
    table = pq.read_table(part)
    index = table.column_names.index("start_ns")
    table = table.set_column(index, "start_ns", pa.array(["x"] * table.num_rows))
    pq.write_table(table, part)
    with pytest.raises(StoreError, match=r"spans-00000\.parquet: column start_ns is string"):
        MeasurementStore(tmp_path)
    assert "column start_ns is string" in _cli_error(["summary", str(tmp_path)])


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ({"M": 1}, "'runs' is dict, expected a list"),
        ([{"status": "ok"}], "runs[0] has no 'levels'"),
    ],
)
def test_a_malformed_manifest_is_named(tmp_path: Path, runs: Any, message: str) -> None:
    _one_run(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"runs": runs}))
    assert message in _cli_error(["summary", str(tmp_path)])
    assert "manifest.json" in _cli_error(["analyze", str(tmp_path)])


def test_run_json_with_null_levels_is_named(tmp_path: Path) -> None:
    run_dir = _one_run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "levels": None}))
    line = _cli_error(["analyze", str(tmp_path)])
    assert "run.json: bad levels" in line and "None" in line


def test_a_level_set_without_span_files_is_named_by_analyze_and_export(tmp_path: Path) -> None:
    run_dir = _one_run(tmp_path)
    (run_dir / "spans-00000.parquet").unlink()
    assert "MF: no span files" in _cli_error(["analyze", str(tmp_path)])
    out = tmp_path / "o.jsonl"
    assert "MF: no span files" in _cli_error(
        ["export", str(tmp_path), "--reconstructed", "-o", str(out)]
    )


def test_a_level_set_whose_span_files_hold_no_spans_is_named_not_exported_as_nothing(
    tmp_path: Path,
) -> None:
    run_dir = _one_run(tmp_path)
    part = run_dir / "spans-00000.parquet"
    table = pq.read_table(part)
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "spans": table.num_rows}))
    pq.write_table(table.slice(0, 0), part)
    said = table.num_rows
    out = tmp_path / "o.jsonl"
    line = _cli_error(["export", str(tmp_path), "--reconstructed", "-o", str(out)])
    assert f"MF: its span files hold no spans (its run.json says {said})" in line
    assert not out.exists()


def test_export_into_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    _one_run(tmp_path / "R")
    line = _cli_error(["export", str(tmp_path / "R"), "-o", str(tmp_path / "nope" / "o.jsonl")])
    assert "no such directory" in line and "nope" in line


def test_missing_level_sets_and_manifests_are_said_not_skipped(tmp_path: Path) -> None:
    for levels in ("M", "MF"):
        write_run(tmp_path, levels, fixture_table("resnet18_train_cpu", levels, f"run-{levels}"))
    warnings: list[str] = []
    assert [r.levels for r in store.open_measurement(tmp_path, warnings.append)] == ["M", "MF"]
    assert warnings == [f"{tmp_path}: no manifest.json; reading the level sets found: M, MF"]
    manifest = {"status": "ok", "runs": [{"levels": "M"}, {"levels": "MF"}, {"levels": "MFL"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    done = CliRunner().invoke(main, ["summary", str(tmp_path)])
    assert done.exit_code == 0, done.output
    said = " ".join(done.stdout.split())  # before the summary it qualifies, however wrapped
    assert f"xsp: warning: level set MFL: {tmp_path / 'MFL'} is missing; left out" in said


def test_a_level_set_left_by_an_earlier_measurement_in_the_same_directory_is_left_out(
    tmp_path: Path,
) -> None:
    # xsp run --levels M,MF --out R, then xsp run --levels M --out R: the old MF stays on disk
    for levels, measurement in (("M", "new"), ("MF", "old")):
        write_run(tmp_path, levels, fixture_table("resnet18_train_cpu", levels, f"run-{levels}"))
        meta = json.loads((tmp_path / levels / "run.json").read_text())
        (tmp_path / levels / "run.json").write_text(
            json.dumps({**meta, "measurement_id": measurement})
        )
    manifest = {"status": "ok", "measurement_id": "new", "runs": [{"levels": "M"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    warnings: list[str] = []
    assert [r.levels for r in store.open_measurement(tmp_path, warnings.append)] == ["M"]
    assert warnings == [f"level set MF: from another measurement than {tmp_path}'s; left out"]


# -- item 12: export never overwrites the store ----------------------------------------------------
@pytest.mark.parametrize("target", ["MF/spans-00000.parquet", "MF/run.json", "manifest.json"])
@pytest.mark.parametrize("command", ["export -o", "analyze --report"])
def test_export_and_report_refuse_to_write_into_the_store(
    tmp_path: Path, target: str, command: str
) -> None:
    root = tmp_path / "R"
    _one_run(root)
    (root / "manifest.json").write_text(json.dumps({"status": "ok", "runs": [{"levels": "MF"}]}))
    before = (root / target).read_bytes()
    name, option = command.split()
    line = _cli_error([name, str(root), option, str(root / target)])
    assert "refusing to write" in line and "inside the run store" in line
    assert (root / target).read_bytes() == before


# -- issue 51: crafted run directories never make xsp write outside where it should -------------
@pytest.mark.parametrize("target", ["MF/spans-00000.parquet", "MF/run.json"])
@pytest.mark.parametrize("command", ["export -o", "analyze --report"])
def test_an_output_linked_into_the_store_is_refused(
    tmp_path: Path, target: str, command: str
) -> None:
    root = tmp_path / "R"
    _one_run(root)
    link = tmp_path / "out.json"
    link.symlink_to(root / target)
    before = (root / target).read_bytes()
    name, option = command.split()
    line = _cli_error([name, str(root), option, str(link)])
    assert line == (
        f"xsp: error: refusing to write {link} (a symbolic link to {root / target}): it is inside "
        f"the run store {root / 'MF'} (its files would be replaced); choose a path outside it"
    )
    assert (root / target).read_bytes() == before


@pytest.mark.parametrize("into", ["another measurement's run", "its own MF run"])
def test_save_reconstruction_never_writes_through_a_link(tmp_path: Path, into: str) -> None:
    root = tmp_path / "R"
    _one_run(root)
    victim = _one_run(tmp_path / "other") if into.startswith("another") else root / "MF"
    files = {p.name: p.read_bytes() for p in victim.iterdir()}
    (root / "reconstructed").symlink_to(victim, target_is_directory=True)
    line = _cli_error(["analyze", str(root), "--save-reconstruction"])
    assert line == (
        f"xsp: error: refusing to write into {root / 'reconstructed'}: it is a symbolic link "
        f"(to {victim}), not a directory of {root}; remove it"
    )
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == files


def test_a_span_part_or_write_probe_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    import os

    victim = tmp_path / "victim.parquet"
    victim.write_bytes(b"another store's part")
    run_dir = tmp_path / "R" / "MF"
    run_dir.mkdir(parents=True)
    (run_dir / f"spans-00000.parquet.{os.getpid()}.tmp").symlink_to(victim)
    table = fixture_table("resnet18_train_cpu", "MF", "run-s")
    store.write_span_part(run_dir, table, "00000")
    assert victim.read_bytes() == b"another store's part"
    (run_dir / ".xsp-write-test").symlink_to(victim)  # the write check's old probe name
    store.check_writable(run_dir)
    assert victim.read_bytes() == b"another store's part"
    assert store.read_span_file(run_dir / "spans-00000.parquet").num_rows == table.num_rows


@pytest.mark.parametrize("levels", ["../other/MF", "/tmp/MF", "MF/..", ".."])
def test_manifest_levels_outside_the_measurement_are_refused(tmp_path: Path, levels: str) -> None:
    root = tmp_path / "R"
    _one_run(root)
    _one_run(tmp_path / "other")
    runs = [{"levels": "MF"}, {"levels": levels}]
    (root / "manifest.json").write_text(json.dumps({"status": "ok", "runs": runs}))
    expected = (
        f"{root / 'manifest.json'}: runs[1] has levels {levels!r}, not a directory of the "
        'measurement (a level set such as "MF")'
    )
    with pytest.raises(StoreError) as refused:
        store.open_measurement(root)
    assert str(refused.value) == expected
    assert _cli_error(["summary", str(root)]) == f"xsp: error: {expected}"


# -- item 15: configuration read when used ---------------------------------------------------------
def test_a_bad_cupti_buffer_size_is_a_config_error_when_used_not_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    from xsp.tracer.capture.hooks import cupti as cuda

    monkeypatch.setenv("XSP_CUPTI_BUFFER_MB", "lots")
    importlib.reload(cuda)  # importing reads nothing
    with pytest.raises(ConfigError, match=r"XSP_CUPTI_BUFFER_MB='lots'"):
        cuda._CuptiSession()
    with pytest.raises(ConfigError, match=r"XSP_CUPTI_BUFFER_MB='lots'"):
        config.check()
    monkeypatch.setenv("XSP_CUPTI_BUFFER_MB", "64")
    assert cuda._CuptiSession().buffer_bytes == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match=r"XSP_OVERLAP='maybe'"):
        config.switch("XSP_OVERLAP", True, {"XSP_OVERLAP": "maybe"})


def test_the_native_core_is_built_where_xsp_native_dir_says() -> None:
    assert config.native_dir({"XSP_NATIVE_DIR": " /opt/xsp-native "}) == Path("/opt/xsp-native")
    assert config.native_dir({"XSP_NATIVE_DIR": ""}) == Path.home() / ".cache/xsp/native"
