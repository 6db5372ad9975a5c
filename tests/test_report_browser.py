"""The HTML report's first screen, as a person sees it in headless Chromium at 1280×800: the
verdict, the causes, the top suggestion, the layers and the replay's warnings all lie above
y = 800 px, without scrolling, for the committed H200 measurement of ResNet-50 training and for
a CPU measurement of ResNet-18 (no GPU: the layers by host time)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from tests.browser import dump_dom
from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.report import write_report

ROOT = Path(__file__).resolve().parents[1]
GPU_MEASUREMENT = ROOT / "benchmarks/data/replay-h200/r50-b64-train"
SCREEN_PX = 800


def first_screen(store: MeasurementStore, page: Path) -> dict[str, dict]:
    """Where the report's first-screen parts lie, in a 1280×800 window."""
    write_report(store, page, "first screen")
    harness = (ROOT / "tests/js/first_screen.js").read_text()
    page.write_text(page.read_text().replace("</body>", f"<script>{harness}</script></body>"))
    dom = dump_dom(page.as_uri(), size="1280,800")
    found = re.search(r'<pre id="xsp-first">(.*?)</pre>', dom, re.S)
    assert found, "the report did not render"
    return json.loads(html.unescape(found.group(1)))


def assert_answers_on_first_screen(at: dict[str, dict]) -> None:
    for part in ("verdict", "causes", "causes_table", "suggestions", "top_suggestion", "layers"):
        assert part in at, f"no {part} on the first screen"
        assert at[part]["bottom"] <= SCREEN_PX, (part, at[part])
    assert at["answer"]["bottom"] <= SCREEN_PX
    # the answer comes before the flame view, the first of the report's sections
    assert at["answer"]["bottom"] <= at["flame"]["top"]


def test_gpu_report_answers_on_its_first_screen(tmp_path: Path) -> None:
    at = first_screen(MeasurementStore(GPU_MEASUREMENT), tmp_path / "r50.html")
    assert_answers_on_first_screen(at)
    assert at["verdict"]["text"].startswith("unchecked: GPU-bound: ")
    assert "channels_last" in at["top_suggestion"]["text"]
    assert "estimated" in at["top_suggestion"]["text"]
    assert "critical path" in at["layers"]["text"]
    # the terminal's warnings about the replay: M ran in one process, no held-out steps
    assert "unchecked across processes" in at["warnings"]["text"]


def test_cpu_report_answers_on_its_first_screen(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    for levels in ("M", "MF"):
        write_run(root, levels, fixture_table("resnet18_train_cpu", levels))
    at = first_screen(MeasurementStore(root), tmp_path / "cpu.html")
    assert_answers_on_first_screen(at)
    assert at["verdict"]["text"].startswith(("host-bound", "unchecked: host-bound"))
    assert "host time" in at["layers"]["text"]


def cut_off_tables(store: MeasurementStore, page: Path) -> tuple[int, list[dict]]:
    """(how many tables, those wider than their box) in an 800 px wide window."""
    write_report(store, page, "widths")
    harness = (ROOT / "tests/js/widths.js").read_text()
    page.write_text(page.read_text().replace("</body>", f"<script>{harness}</script></body>"))
    dom = dump_dom(page.as_uri(), size="800,800")
    found = re.search(r'<pre id="xsp-widths">(.*?)</pre>', dom, re.S)
    assert found, "the report did not render"
    tables = json.loads(html.unescape(found.group(1)))
    return len(tables), [t for t in tables if t["content"] > t["width"]]


def test_every_table_fits_800_px(tmp_path: Path) -> None:
    """5 of the r50 report's 23 tables were cut off at 800 px, Suggestions among them."""
    count, cut = cut_off_tables(MeasurementStore(GPU_MEASUREMENT), tmp_path / "r50.html")
    assert count == 23 and cut == []
    root = tmp_path / "cpu"
    for levels in ("M", "MF"):
        write_run(root, levels, fixture_table("resnet18_train_cpu", levels))
    count, cut = cut_off_tables(MeasurementStore(root), tmp_path / "cpu.html")
    assert count >= 8 and cut == []
