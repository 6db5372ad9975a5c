"""The HTML report and the analyze command on the committed H200 measurement."""

from __future__ import annotations

from pathlib import Path

from analysis.report import write_report
from analysis.store import MeasurementStore

H200_STORE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "r50-b64-train"


def test_report_is_one_self_contained_file_with_flame_view_and_every_analysis(
    tmp_path: Path,
) -> None:
    out = tmp_path / "report.html"
    sections = write_report(MeasurementStore(H200_STORE), out, "ResNet-50")
    page = out.read_text()
    assert sections >= 12
    # plotly.js is inlined once: the file opens offline
    assert '<script src="http' not in page and len(page) > 3_000_000
    assert page.count("Plotly.newPlot") >= sections + 1
    for heading in (
        "Flame view",
        "Suggestions",
        "Kernels by layer (A11)",
        "GPU and non-GPU time per layer (A13)",
        "Idle time: host wait against kernel wait (HTA)",
        "Kernel launch statistics (HTA)",
    ):
        assert f"<h2>{heading}</h2>" in page
    assert "layout-transposes" in page
