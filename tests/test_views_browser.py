"""The HTML report as a person sees it, in headless Chromium: the flame view's boxes are as wide
as their spans last, every parent is at least as wide as its children together, the root is the
step, and the timeline has rows for the GPU streams. Checked on the committed H200 measurement
of ResNet-50 training (batch 64, level sets M, MF, MFL, MFLG)."""

from __future__ import annotations

import html
import itertools
import json
import re
from pathlib import Path

import pytest

from tests.browser import dump_dom
from xsp.analysis.figures.views import median_iteration
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.reconstruction.reconstruct import reconstruct
from xsp.analysis.report import write_report

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENT = ROOT / "benchmarks/data/r50-b64-train"


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[int, int], int]:
    """(what the page shows, reconstructed duration by span id, the shown step's duration)."""
    store = MeasurementStore(MEASUREMENT)
    page = tmp_path_factory.mktemp("report") / "report.html"
    write_report(store, page, "r50")
    harness = (ROOT / "tests/js/geometry.js").read_text()
    page.write_text(page.read_text().replace("</body>", f"<script>{harness}</script></body>"))
    dom = dump_dom(page.as_uri())
    found = re.search(r'<pre id="xsp-geometry">(.*?)</pre>', dom, re.S)
    assert found, "the report did not render"
    spans, _ = reconstruct(store)
    iteration = median_iteration(spans)
    rows = [r for r in spans.to_pylist() if r["iteration"] == iteration]
    durations = {r["span_id"]: r["dur_ns"] for r in rows}
    step = next(r["dur_ns"] for r in rows if r["kind"] == "step")
    return json.loads(html.unescape(found.group(1))), durations, step


def test_flame_boxes_are_as_wide_as_their_spans_last(shown: tuple) -> None:
    page, durations, step_ns = shown
    boxes = page["flame"]
    assert len(boxes) > 1000  # ResNet-50's layers and ops, seven levels deep
    root = next(b for b in boxes if b["parent"] is None)
    assert root["value"] == step_ns  # the root is the step, in integer nanoseconds
    px_per_ns = root["width"] / step_ns
    # phase boxes have ids "<parent>/<phase>@t"; boxes below the depth shown have no height
    spans = [b for b in boxes if "/" not in b["id"] and b["height"] > 0]
    assert len(spans) > 1000
    for box in spans:
        assert box["value"] == durations[int(box["id"])], box
        # drawn width: the span's duration on the root's scale (within a pixel of rounding)
        assert box["width"] == pytest.approx(box["value"] * px_per_ns, abs=1.0), box


def test_flame_parents_hold_their_children_and_the_backward_pass_is_one_box(shown: tuple) -> None:
    page, _, _ = shown
    boxes = {b["id"]: b for b in page["flame"]}
    children: dict[str, list[dict]] = {}
    for box in boxes.values():
        if box["parent"] is not None:
            children.setdefault(box["parent"], []).append(box)
    for parent_id, kids in children.items():
        parent = boxes[parent_id]
        assert sum(k["value"] for k in kids) <= parent["value"]
        assert sum(k["x1"] - k["x0"] for k in kids) <= parent["x1"] - parent["x0"] + 0.5
        # left to right in time: siblings follow each other without overlapping
        ordered = sorted(kids, key=lambda k: k["x0"])
        assert all(a["x1"] <= b["x0"] + 0.5 for a, b in itertools.pairwise(ordered))
    root = next(b for b in boxes.values() if b["parent"] is None)
    under_step = [k["id"].split("/")[-1].split("@")[0] for k in children[root["id"]]]
    # zero_grad, the forward pass (model and loss), the 339 autograd nodes as one box, step(),
    # and M's closing device synchronization
    assert len(under_step) == 5 and under_step[1:3] == ["forward", "backward"]
    backward = next(k for k in children[root["id"]] if "/backward@" in k["id"])
    assert len(children[backward["id"]]) == 339


def test_timeline_has_host_threads_and_gpu_streams_as_rows(shown: tuple) -> None:
    page, _, _ = shown
    rows = page["timelineRows"]
    assert "step" in rows
    assert any(r.startswith("GPU 0 · stream 7") for r in rows)
    assert any(r.startswith("thread ") for r in rows)
    assert {t["name"] for t in page["timelineTraces"]} == {"model", "framework", "library", "gpu"}
    gpu = next(t for t in page["timelineTraces"] if t["name"] == "gpu")
    assert gpu["bars"] == 791  # every GPU activity of the iteration (kernels, memcpys, memsets)
