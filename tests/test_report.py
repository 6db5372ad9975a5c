"""The HTML report and the analyze command on the committed H200 measurement."""

from __future__ import annotations

import json
from pathlib import Path

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.report import write_report

H200_STORE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "r50-b64-train"


def test_report_is_one_self_contained_file_with_flame_view_and_every_analysis(
    tmp_path: Path,
) -> None:
    out = tmp_path / "report.html"
    sections = write_report(MeasurementStore(H200_STORE), out, "ResNet-50")
    page = out.read_text()
    assert sections >= 12
    # plotly.js is inlined once, compressed: the file opens offline, and is lighter
    assert '<script src="http' not in page and page.count("text/x-xsp-plotly-gzip") == 2
    assert 2_000_000 < len(page) < 3_500_000
    # every analysis is an HTML table with all its rows; the eight analyses with a chart (the
    # step's causes, layers by GPU time, layer types, layer latency, kernels, busy %,
    # durations, TFLOP/s per layer) plot, each when scrolled near
    assert page.count("<div class='table'><table") == sections
    assert page.count("Plotly.newPlot") == 8
    assert page.count('<script type="text/x-xsp-when-seen">') == 8
    # the flame view and the timeline are canvases drawn from one embedded document
    assert "<h2 id='flame'>Flame view</h2>" in page and "<h2 id='timeline'>Timeline</h2>" in page
    assert page.count("id='xsp-step-data'") == 1
    for key, heading in (
        ("suggestions", "Suggestions"),
        ("kernels_by_layer", "Kernels by layer (A11)"),
        ("gpu_time_per_layer", "GPU and non-GPU time per layer (A13)"),
        ("idle_breakdown", "Idle time: host wait against kernel wait (HTA)"),
        ("launch_statistics", "Kernel launch statistics (HTA)"),
    ):
        assert f"<h2 id='{key}'>{heading}</h2>" in page
    # A3 lists all 158 layer calls of ResNet-50's forward pass: nothing cut without a note
    assert "158 rows" in page
    assert "layout-transposes" in page


def test_a_cpu_report_has_no_gpu_sections(tmp_path: Path) -> None:
    """The CPU demo's report had an MFU section against a TF32 roof with 1 GPU, an empty chart
    and a note about hardware counters; its memory chart was titled "cpu:-1"."""
    from tests.fixtures import fixture_table, write_run

    root = tmp_path / "cpu"
    for levels in ("M", "MF"):
        write_run(root, levels, fixture_table("resnet18_train_cpu", levels))
    out = tmp_path / "cpu.html"
    write_report(MeasurementStore(root), out, "cpu")
    page = out.read_text()
    page = page[: page.index("<script type='text/x-xsp-plotly-gzip'>")]  # plotly's own text
    for gpu_only in ("MFU", "tf32", "Over kernels", "Roof", "GPUs", "Hardware counters"):
        assert gpu_only not in page, gpu_only
    # the FLOPs themselves stay, with the rate over the untraced step
    assert "<h2 id='model_flops'>Model FLOPs</h2>" in page
    assert "<th title='over_step_tflop_per_s'>Over step (TFLOP/s)</th>" in page
    assert "cpu:-1" not in page


def test_launch_statistics_say_per_iteration(tmp_path: Path) -> None:
    from xsp.analysis.tables.kernels import launch_statistics

    (row,) = launch_statistics(MeasurementStore(H200_STORE)).to_pylist()
    # the run's total beside its iterations and the figure per iteration
    assert row["kernels"] == row["iterations"] * row["kernels_per_iteration"]


def test_first_screen_shows_the_measured_gain_where_xsp_verify_ran(tmp_path: Path) -> None:
    from xsp.analysis.answer import Answer, answer_html, measured_gains

    assert measured_gains(tmp_path) == {}  # xsp verify did not run
    (tmp_path / "verify").mkdir()
    rows = [
        {
            "rule": "channels_last",
            "measured_gain_ms_per_iteration": 1.5,
            "measured_gain_ci_ms": [1.25, 1.75],
            "status": "measured",
        },
        {
            "rule": "host_syncs",
            "measured_gain_ms_per_iteration": None,
            "measured_gain_ci_ms": None,
            "status": "needs a code change",
        },
    ]
    (tmp_path / "verify" / "verify.json").write_text(json.dumps({"rows": rows}))
    said = measured_gains(tmp_path)
    assert said == {
        "channels_last": "measured 1.50 ms/iteration (95% CI 1.25 to 1.75)",
        "host_syncs": "verify: needs a code change",
    }
    suggestion = {
        "rule": "channels_last",
        "advice": "use channels_last",
        "evidence": "",
        "gain_ms_per_iteration": 1.84,
        "share_pct": 5.6,
        "measured": said["channels_last"],
    }
    page = answer_html(Answer(verdict="GPU-bound", suggestions=[suggestion], warnings=["off"]))
    assert "estimated 1.84 ms/iteration (5.6% of the step); measured 1.50" in page
    assert "<p id='verdict'>GPU-bound</p>" in page and "⚠ off" in page
