"""The HTML report's flame view and timeline as a person sees them, in headless Chromium: every
GPU activity of the replayed step is a box under the call that launched it, a layer's tooltip
gives its GPU time (forward + backward) and its time on the critical path, the step-time flame
draws each span as wide as it lasts, and the timeline has every span of the step as a named
bar, every depth, each kernel linked to its launch. Checked on the committed H200 measurement
of ResNet-50 training (batch 64, level sets M, MF, MFLG)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.browser import dump_dom
from xsp.analysis.figures.views import median_step
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.reconstruction.reconstruct import reconstruct
from xsp.analysis.report import write_report

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENT = ROOT / "benchmarks/data/replay-h200/r50-b64-train"


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict]]:
    """(what the page shows, the reconstructed spans of the step it shows)."""
    store = MeasurementStore(MEASUREMENT)
    page = tmp_path_factory.mktemp("report") / "report.html"
    write_report(store, page, "r50")
    harness = (ROOT / "tests/js/geometry.js").read_text()
    page.write_text(page.read_text().replace("</body>", f"<script>{harness}</script></body>"))
    dom = dump_dom(page.as_uri())
    found = re.search(r'<pre id="xsp-geometry">(.*?)</pre>', dom, re.S)
    assert found, "the report did not render"
    spans, _ = reconstruct(store)
    found_step = median_step(spans)
    assert found_step is not None
    rows = spans.filter(pc.equal(spans.column("iteration"), found_step[0])).to_pylist()
    return json.loads(html.unescape(found.group(1))), rows


def _ms(text: str, label: str) -> float:
    found = re.search(re.escape(label) + r": ([0-9.]+) ms", text)
    assert found, (label, text)
    return float(found.group(1))


def test_every_gpu_activity_of_the_step_is_a_flame_box(shown: tuple) -> None:
    page, rows = shown
    gpu = [r for r in rows if r["level"] == "gpu"]
    assert len(gpu) == 791  # 737 kernels and 54 memsets in the replayed step
    # a GPU-bound step: the flame opens on GPU time
    assert page["mode"] == "gpu"
    boxes = [b for b in page["gpuBoxes"] if b["level"] == "gpu"]
    assert len(boxes) == len(gpu)
    # packed by GPU time: the step's box is as wide as its activities together
    root = page["gpuBoxes"][0]
    total = sum(r["dur_ns"] for r in gpu)
    assert root["value"] == total
    px_per_ns = (root["x1"] - root["x0"]) / total
    for box in boxes[:50]:
        assert box["x1"] - box["x0"] == pytest.approx(box["value"] * px_per_ns, abs=0.5)


def test_layer_tooltips_give_gpu_and_critical_path_time(shown: tuple) -> None:
    page, rows = shown
    step_ms = next(r["dur_ns"] for r in rows if r["kind"] == "step") / 1e6
    for layer in ("layer1", "layer4"):
        # forward and backward: autograd tags backward kernels with the forward module's path
        expected = sum(
            r["dur_ns"]
            for r in rows
            if r["level"] == "gpu" and (r["module_path"] or "").split(".")[0] == layer
        )
        tip = page["tips"][layer]
        assert _ms(tip, "layer GPU time (forward + backward)") == pytest.approx(
            expected / 1e6, abs=5e-4
        )
        assert 0 < _ms(tip, "layer time on the critical path") < step_ms
    assert _ms(page["tips"]["layer1"], "layer GPU time (forward + backward)") == pytest.approx(
        9.580, abs=5e-4
    )
    # the model's own box: every kernel a layer launched
    whole = sum(r["dur_ns"] for r in rows if r["level"] == "gpu" and r["module_path"] is not None)
    assert _ms(page["tips"]["ResNet"], "layer GPU time (forward + backward)") == pytest.approx(
        whole / 1e6, abs=5e-4
    )
    assert "layer GPU time (forward + backward): 9.580 ms" in page["hostTip"]


def test_step_time_flame_draws_spans_where_the_replay_put_them(shown: tuple) -> None:
    page, rows = shown
    boxes = page["hostBoxes"]
    host = [r for r in rows if r["level"] != "gpu"]
    # every host span, and the two phase boxes (forward's 3 calls, backward's 339 nodes)
    assert len(boxes) == len(host) + 2 == 4198
    root = boxes[0]
    step_ns = next(r["dur_ns"] for r in rows if r["kind"] == "step")
    assert root["value"] == step_ns
    px_per_ns = (root["x1"] - root["x0"]) / step_ns
    durations = sorted(r["dur_ns"] for r in host)
    assert sorted(b["value"] for b in boxes if b["level"] != "phase") == durations
    for box in boxes:
        assert box["x1"] - box["x0"] == pytest.approx(box["value"] * px_per_ns, abs=0.5)
        assert box["x0"] >= root["x0"] - 0.5 and box["x1"] <= root["x1"] + 0.5


def test_timeline_has_every_span_as_a_named_bar_and_links_kernels_to_launches(
    shown: tuple,
) -> None:
    page, rows = shown
    bars = page["bars"]
    assert len(bars) == len(rows) == 4987  # every depth: none left out
    assert all(bar["name"] for bar in bars)
    assert page["timelineDrawn"]["boxes"] == len(bars) and page["timelineDrawn"]["labels"] > 0
    lanes = [lane[0] for lane in page["lanes"]]
    assert lanes[0] == "step" and lanes[-1] == "GPU 0 · stream 7"
    assert sum(lane[2] for lane in page["lanes"]) == 1 + max(bar["row"] for bar in bars)
    # a kernel's tooltip names its launch, which the view outlines with an arrow between them
    assert "launched by cudaLaunchKernel" in page["kernelTip"]
    assert page["kernelLinks"] == 1


def test_charts_unpack_plotly_when_scrolled_near(shown: tuple) -> None:
    page, _ = shown
    assert not page["plotlyBeforeScroll"]  # the page opened without parsing plotly
    assert page["chartDrawn"]
