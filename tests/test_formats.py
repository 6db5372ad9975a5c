"""The export formats' registry: `xsp export` lists what it holds, and a format called outside the
CLI writes what `xsp export` writes; on the committed H200 measurement (ResNet-50 training,
batch 64: 20 measured iterations, a GPU monitor in every run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from xsp.cli import main
from xsp.cli.export import export
from xsp.core.errors import ConfigError, XspError
from xsp.core.store import open_measurement, open_run
from xsp.tracer.export import formats
from xsp.tracer.export.formats import FORMATS, ExportSource

ROOT = Path(__file__).resolve().parents[1]
R50 = ROOT / "benchmarks/data/r50-b64-train"


def test_the_cli_lists_the_registry() -> None:
    option = next(p for p in export.params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    assert (
        list(option.type.choices)
        == list(FORMATS)
        == ["otlp-json", "chrome", "chrome-ns", "otlp-metrics-json"]
    )
    assert option.default == "otlp-json"
    for fmt in FORMATS.values():
        assert f"{fmt.name}: {fmt.help}" in (option.help or "")


def test_an_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"'svg' \(known: otlp-json, chrome, chrome-ns, otlp-metrics-json\)"
    ):
        formats.get("svg")


def test_a_format_outside_the_cli_writes_what_the_cli_writes(tmp_path: Path) -> None:
    """One line per iteration: 20 traces."""
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "cli.jsonl"
    said = formats.get("otlp-json").write(ExportSource.of_runs([open_run(R50 / "M")]), ours)
    assert said == f"wrote 20 traces to {ours}"
    done = CliRunner().invoke(main, ["export", str(R50 / "M"), "-o", str(theirs)])
    assert done.exit_code == 0, done.output
    assert ours.read_bytes() == theirs.read_bytes()
    assert len(ours.read_text().splitlines()) == 20


def test_the_metrics_format_reads_no_spans(tmp_path: Path) -> None:
    """Four runs (M, MF, MFL, MFLG), each with monitor samples: four lines."""

    def spans() -> list[formats.RunSpans]:
        raise AssertionError("the metrics format read the spans")

    out = tmp_path / "metrics.jsonl"
    source = ExportSource(open_measurement(R50), spans)
    said = formats.get("otlp-metrics-json").write(source, out)
    assert said == f"wrote the monitor metrics of 4 runs to {out}"
    assert len(out.read_text().splitlines()) == 4


def test_the_metrics_format_without_samples(tmp_path: Path) -> None:
    run = tmp_path / "measurement" / "M"
    run.mkdir(parents=True)
    for name in ("run.json", "spans-00000.parquet"):  # no monitor.parquet: as on a CPU
        shutil.copy(R50 / "M" / name, run / name)
    source = ExportSource.of_runs([open_run(run)])
    with pytest.raises(
        XspError, match=r"no GPU monitor samples in \S+/measurement \(CPU runs have none\)"
    ):
        formats.get("otlp-metrics-json").write(source, None)
