"""A damaged store file is an error, never data: page checksums catch flipped bits, and values
no writer stores (a negative duration, a null id or time, an end before its start) are refused
on read. Every command that reads spans says so in one line naming the file, with exit code 2."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.fixtures import fixture_table, write_run
from tests.test_intervals import within
from xsp.analysis.measurement.matching import tree_depths
from xsp.analysis.measurement.store import MeasurementStore
from xsp.campaign.files import from_dict
from xsp.campaign.store import CampaignStore
from xsp.cli import main as cli_main
from xsp.core import store
from xsp.core.errors import DamagedFileError

LEVELS = "MF"
PART = "spans-00000.parquet"


def _table() -> pa.Table:
    return fixture_table("resnet18_train_cpu", LEVELS, "run-d")


def _with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _silent_flip(path: Path, column: str) -> int:
    """Flip one bit inside ``column``'s chunk of ``path`` such that a reader without checksum
    verification reads the file and gets other values (what 26 of 200 flips did before
    checksums); returns the byte offset flipped."""
    good = pq.read_table(path)
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    index = [chunk.column(i).path_in_schema for i in range(chunk.num_columns)].index(column)
    meta = chunk.column(index)
    begin = meta.dictionary_page_offset or meta.data_page_offset
    data = path.read_bytes()
    middle = begin + meta.total_compressed_size // 2
    for offset in range(middle, begin + meta.total_compressed_size):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            path.write_bytes(damaged)
            try:
                if not pq.read_table(path, page_checksum_verification=False).equals(good):
                    return offset
            except (OSError, pa.ArrowException):
                pass  # a flip that breaks decoding: not the silent kind
    raise AssertionError(f"no silent flip found in {column}")


def _stored(tmp_path: Path, table: pa.Table) -> Path:
    return write_run(tmp_path / "R", LEVELS, table)


def _damaged_runs(tmp_path: Path) -> dict[str, Path]:
    """A run directory per kind of damage, each written by the store's own writer."""
    table = _table()
    dur = table.column("dur_ns").combine_chunks()
    steps = pc.equal(table.column("kind"), "step")
    flipped = _stored(tmp_path / "flip", table)
    _silent_flip(flipped / PART, "dur_ns")
    end_past = pc.if_else(steps, (1 << 63) - 10, table.column("start_ns"))
    return {
        "flipped bit": flipped,
        "negative dur_ns": _stored(
            tmp_path / "neg", _with_column(table, "dur_ns", pc.if_else(steps, -2_865_567, dur))
        ),
        "null dur_ns": _stored(
            tmp_path / "null", _with_column(table, "dur_ns", pc.if_else(steps, None, dur))
        ),
        "end past int64": _stored(tmp_path / "end", _with_column(table, "start_ns", end_past)),
    }


EXPECTED = {
    "flipped bit": "corrupt or truncated span file (could not verify page integrity",
    "negative dur_ns": "damaged span file: dur_ns is negative in 1 spans (as low as -2865567)",
    "null dur_ns": "damaged span file: dur_ns is null in 1 spans",
    "end past int64": "start_ns + dur_ns is past the int64 range (an end before its start)",
}


@pytest.mark.parametrize("damage", list(EXPECTED))
def test_a_damaged_span_file_is_refused_by_every_reader(tmp_path: Path, damage: str) -> None:
    run_dir = _damaged_runs(tmp_path)[damage]
    part = run_dir / PART
    with pytest.raises(DamagedFileError) as raised:
        MeasurementStore(run_dir)
    message = str(raised.value)
    assert message.startswith(f"{part}: ") and EXPECTED[damage] in message
    assert "\n" not in message
    with pytest.raises(DamagedFileError, match=PART):
        store.open_run(run_dir).spans()


def _one_error_line(result: object, part: Path, code: int = 2) -> str:
    exit_code = result.exit_code  # type: ignore[attr-defined]
    output = result.output  # type: ignore[attr-defined]
    assert exit_code == code, output
    assert isinstance(result.exception, SystemExit), output  # type: ignore[attr-defined]
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("xsp: error: ") and str(part) in lines[0], output
    return str(lines[0])


COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "summary": lambda run, tmp: ["summary", str(run)],
    "analyze": lambda run, tmp: ["analyze", str(run)],
    "export": lambda run, tmp: ["export", str(run), "-o", str(tmp / "out.jsonl")],
    "export chrome": lambda run, tmp: [
        *["export", str(run), "--format", "chrome", "-o", str(tmp / "out.json.gz")]
    ],
    # nothing listens on port 9: the spans are read (and refused) before anything is sent
    "push": lambda run, tmp: ["push", str(run), "--endpoint", "http://127.0.0.1:9/v1/traces"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_says_one_line_naming_the_file_and_exits_2(
    tmp_path: Path, command: str
) -> None:
    for damage, run_dir in _damaged_runs(tmp_path).items():
        result = CliRunner().invoke(cli_main, COMMANDS[command](run_dir, tmp_path))
        line = _one_error_line(result, run_dir / PART)
        assert EXPECTED[damage] in line, (damage, line)
        assert "-2.87" not in line and "-2865567 ns" not in result.output


def _campaign(root: Path, table: pa.Table) -> Path:
    """A campaign directory as ``xsp campaign run`` leaves it, with one job and its run."""
    spec = from_dict(
        {
            "campaign": {"device": "cpu", "level_sets": ["M"]},
            "models": {"names": ["torchvision:squeezenet1_1"]},
        }
    )
    campaign = CampaignStore(root)
    campaign.begin(spec)
    job = spec.jobs()[0]
    write_run(campaign.run_dir(job), "M", table.filter(pc.equal(table.column("level"), "model")))
    record = {"job": job.id, "status": "ok", "summary": {"latency_ms": 1.0}}
    campaign.save({**record, "model": job.model, "mode": job.mode, "batch_size": 1})
    return campaign.run_dir(job) / "M" / PART


def test_campaign_readers_refuse_a_damaged_span_file(tmp_path: Path) -> None:
    table = _table()
    _campaign(tmp_path / "before", table)
    steps = pc.equal(table.column("kind"), "step")
    negative = pc.if_else(steps, -2_865_567, table.column("dur_ns"))
    part = _campaign(tmp_path / "after", _with_column(table, "dur_ns", negative))
    with pytest.raises(DamagedFileError, match=f"{part}: damaged span file: dur_ns is negative"):
        CampaignStore(tmp_path / "after").connect()
    sql = ["campaign", "sql", str(tmp_path / "after"), "SELECT count(*) FROM spans"]
    _one_error_line(CliRunner().invoke(cli_main, sql), part)
    diff = ["campaign", "diff", str(tmp_path / "before"), str(tmp_path / "after")]
    _one_error_line(CliRunner().invoke(cli_main, diff), part)


def test_a_side_table_with_a_flipped_bit_is_refused(tmp_path: Path) -> None:
    run_dir = _stored(tmp_path, _table())
    samples = pa.table({"time_ns": pa.array(range(0, 50_000, 10), pa.int64())})
    store.write_monitor_samples(run_dir, samples)
    path = run_dir / store.MONITOR
    _silent_flip(path, "time_ns")
    with pytest.raises(DamagedFileError, match=f"{path}: corrupt or truncated monitor file"):
        store.open_run(run_dir).monitor()


def test_intact_files_of_a_writer_without_checksums_still_read(tmp_path: Path) -> None:
    run_dir = _stored(tmp_path, _table())
    table = pq.read_table(run_dir / PART)
    pq.write_table(table, run_dir / PART, write_page_checksum=False)
    assert store.open_run(run_dir).spans().num_rows == table.num_rows


def _cyclic(table: pa.Table, rows: dict[int, int]) -> pa.Table:
    """``table`` with the parent ids of ``rows`` set to the span ids of the rows they name."""
    ids = table.column("span_id").to_pylist()
    parents = table.column("parent_span_id").to_pylist()
    for row, up in rows.items():
        parents[row] = ids[up]
    return _with_column(table, "parent_span_id", pa.array(parents, pa.uint64()))


def test_a_cycle_of_parent_ids_is_read_as_roots(tmp_path: Path) -> None:
    # spans 1..7: 1 <- 2; 3 is its own parent, 4 its child; 5 <-> 6, 7 a child of 6
    tiny = pa.table(
        {
            "trace_id": pa.array([b"t" * 16] * 7, pa.binary(16)),
            "span_id": pa.array([1, 2, 3, 4, 5, 6, 7], pa.uint64()),
            "parent_span_id": pa.array([0, 1, 3, 3, 6, 5, 6], pa.uint64()),
            "name": ["a", "b", "c", "d", "e", "f", "g"],
            "start_ns": pa.array([0, 1, 2, 3, 4, 5, 6], pa.int64()),
            "dur_ns": pa.array([10] * 7, pa.int64()),
            "level": ["framework", "framework", "library", "library", "gpu", "gpu", "gpu"],
        }
    )
    run_dir = write_run(tmp_path, LEVELS, store.conform(tiny))
    with within(1.0):
        measurement = MeasurementStore(run_dir)
        depth = tree_depths(measurement, 0)
    assert depth.tolist() == [0, 1, 0, 1, 0, 0, 1]
    assert measurement.parents(0).tolist() == [-1, 0, -1, 2, -1, -1, 5]
    parents = measurement.run_spans(0).column("parent_span_id").to_pylist()
    assert parents == [0, 1, 0, 3, 0, 0, 6]  # SQL's joins see the same forest
    assert measurement.warnings == [
        f"{run_dir}: 3 spans are their own ancestors (a cycle of parent ids); each is read as a "
        "root"
    ]
    # the Chrome export climbs to a framework span for each external id: 3..7 have none above
    with within(10.0):
        result = CliRunner().invoke(cli_main, COMMANDS["export chrome"](run_dir, tmp_path))
    assert result.exit_code == 0, result.output
    with gzip.open(tmp_path / "out.json.gz", "rt") as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
    external = {e["name"]: e["args"].get("External id") for e in events}
    assert external == {"a": 1, "b": 2, "c": None, "d": None, "e": None, "f": None, "g": None}


@pytest.mark.parametrize("command", ["summary", "analyze"])
def test_commands_end_on_a_store_with_parent_cycles(tmp_path: Path, command: str) -> None:
    table = _table()
    ops = pc.indices_nonzero(pc.equal(table.column("kind"), "op")).to_pylist()
    # an op its own parent, two more each other's: the analyses looped for ever before
    run_dir = _stored(
        tmp_path, _cyclic(table, {ops[3]: ops[3], ops[10]: ops[20], ops[20]: ops[10]})
    )
    with within(120.0):
        result = CliRunner().invoke(cli_main, COMMANDS[command](run_dir, tmp_path))
    assert result.exit_code == 0, result.output
    assert "3 spans are their own ancestors" in " ".join(result.output.split())  # wrapped


def test_a_part_without_page_checksums_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A span part of an older writer (no CRC32 per page) reads, with one line naming it; every
    committed fixture has them (rewritten), so none of them says it."""
    from xsp.core.parquet_pages import has_page_checksums

    source = next(Path("benchmarks/data/trusted-h100/b1-infer/M").glob("spans-*.parquet"))
    old = tmp_path / "spans-00000.parquet"
    pq.write_table(pq.read_table(source), old, write_page_checksum=False)
    with caplog.at_level("WARNING"):
        store.read_span_file(old)
        store.read_span_file(old)
        store.read_span_file(source)
    lines = [r.getMessage() for r in caplog.records if "page checksums" in r.getMessage()]
    assert lines == [
        f"xsp: warning: {old} has no page checksums (written before xsp wrote them): a damaged value in it may go unnoticed"
    ]
    committed = [p for p in Path(".").glob("*/data/**/*.parquet")]
    assert committed and all(has_page_checksums(pq.ParquetFile(p), p) for p in committed)


@pytest.mark.parametrize(
    ("file", "text", "expected"),
    [
        (
            "M/run.json",
            "[" * 100_000 + "]" * 100_000,
            "run.json: not readable JSON (nested too deep)",
        ),
        ("manifest.json", '{"runs": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deep"),
        ("M/spans-00000.parquet", None, "corrupt or truncated span file"),
    ],
)
def test_damaged_documents_and_footers_are_one_line(
    file: str, text: str | None, expected: str, tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree("benchmarks/data/trusted-h100/b1-infer", run)
    path = run / file
    if text is None:  # the footer's thrift garbled
        data = bytearray(path.read_bytes())
        data[-20:-8] = b"\xff" * 12
        path.write_bytes(bytes(data))
    else:
        path.write_text(text)
    done = CliRunner().invoke(cli_main, ["summary", str(run)])
    assert done.exit_code != 0 and expected in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)


def test_a_resource_that_is_not_an_object_reads(tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree("benchmarks/data/trusted-h100/b1-infer", run)
    meta = json.loads((run / "M/run.json").read_text())
    meta["resource"] = "x"
    (run / "M/run.json").write_text(json.dumps(meta))
    done = CliRunner().invoke(cli_main, ["summary", str(run)])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
