"""Memory over the step on the committed H200 ResNet-50 b64 training measurement
(``benchmarks/data/replay-h200/r50-b64-train``): every expected number is worked out here from
its MF run's memory.parquet and spans with pyarrow and numpy, apart from the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from xsp.analysis.figures.charts import memory_over_step
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables import memory_timeline as mt

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "benchmarks" / "data" / "replay-h200" / "r50-b64-train"


@pytest.fixture(scope="module")
def events() -> dict[str, np.ndarray]:
    """The CUDA events of the first iteration that reaches the run's peak, time-ordered."""
    table = pq.read_table(STORE / "MF" / "memory.parquet")
    table = table.filter(pc.equal(table["device"], "cuda"))
    total = np.asarray(table["total_allocated"])
    iteration = np.asarray(table["iteration"])
    first = int(iteration[total == total.max()].min())
    table = table.filter(pc.equal(table["iteration"], first))
    table = table.take(pc.sort_indices(table["time_ns"]))
    paths = table["module_path"].cast("string").to_pylist()
    phases = table["phase"].cast("string").to_pylist()
    return {
        "iteration": np.asarray(first),
        "time_ns": np.asarray(table["time_ns"]),
        "bytes": np.asarray(table["bytes"]),
        "total": np.asarray(table["total_allocated"]),
        "layer": np.asarray(
            [
                p if p is not None else f"(no layer: {ph})"
                for p, ph in zip(paths, phases, strict=True)
            ],
            dtype=object,
        ),
    }


def _held_at(events: dict[str, np.ndarray], peak: int) -> dict[str, int]:
    """Each layer's bytes still allocated after event ``peak``: every free takes, of the
    allocations of its size not yet freed, the one made last (searched backwards here)."""
    sizes, layers = events["bytes"][: peak + 1], events["layer"][: peak + 1]
    freed = np.zeros(len(sizes), dtype=bool)
    for i in np.flatnonzero(sizes < 0):
        earlier = np.flatnonzero((sizes[:i] == -sizes[i]) & ~freed[:i])
        if len(earlier):
            freed[earlier[-1]] = True
    alive = (sizes > 0) & ~freed
    held: dict[str, int] = {}
    for layer, size in zip(layers[alive], sizes[alive], strict=True):
        held[layer] = held.get(layer, 0) + int(size)
    return held


def test_the_peak_and_the_layers_held_at_it(events: dict[str, np.ndarray]) -> None:
    store = MeasurementStore(STORE)
    timeline = mt.memory_timeline(store)
    assert timeline is not None
    peak = int(np.argmax(events["total"]))
    # the run's peak, 5,854,792,192 bytes, first reached in iteration 0 on cuda:0
    assert timeline.peak_bytes == int(events["total"].max()) == 5_854_792_192
    assert (timeline.iteration, timeline.device, timeline.levels) == (0, "GPU 0", "MF")
    assert timeline.peak == peak and len(timeline.total_bytes) == len(events["total"]) == 1365
    # at the start of the backward pass: ResNet-50's last ReLU's backward
    assert timeline.peak_where == "layer4.2.relu, aten::threshold_backward (backward)"
    spans = pq.read_table(STORE / "MF" / "spans-00000.parquet")
    step = spans.filter(pc.and_(pc.equal(spans["kind"], "step"), pc.equal(spans["iteration"], 0)))
    step_start = step["start_ns"][0].as_py()
    assert timeline.peak_ms == pytest.approx((events["time_ns"][peak] - step_start) / 1e6)
    held = _held_at(events, peak)
    table = mt.alive_at_peak(timeline).to_pylist()
    assert {r["layer"]: r["held_bytes"] for r in table} == {k: v for k, v in held.items() if v}
    # the largest: the stem's and layer1's outputs of 64 x 256 x 56 x 56 fp32 (196 MiB each),
    # saved for the backward pass that has just begun
    ranked = sorted(held.items(), key=lambda kv: (-kv[1], kv[0]))
    assert {k for k, v in ranked[:9]} == {
        "bn1",
        "conv1",
        "layer1.0.bn3",
        "layer1.1.bn3",
        "layer1.2.bn3",
        "layer1.0.conv3",
        "layer1.1.conv3",
        "layer1.2.conv3",
        "layer1.0.downsample.0",
    }
    assert all(v >= 64 * 256 * 56 * 56 * 4 for _, v in ranked[:9])
    assert table[0]["held_bytes"] == ranked[0][1]
    assert table[0]["share_of_peak_pct"] == pytest.approx(100 * ranked[0][1] / 5_854_792_192)
    # what no layer of the step holds is the allocator's total less the layers' bytes
    before = timeline.held(peak)[mt.BEFORE]
    assert before == 5_854_792_192 - sum(held.values())
    assert sum(r["held_bytes"] for r in table) + before == timeline.peak_bytes


def test_the_json_series_is_bounded_and_keeps_the_peak(events: dict[str, np.ndarray]) -> None:
    timeline = mt.memory_timeline(MeasurementStore(STORE))
    assert timeline is not None
    found = mt.series(timeline, points=100)
    points = found["points"]
    assert len(points) <= 100 and found["events"] == 1365
    by_time = dict(zip((timeline.time_ms).round(6).tolist(), events["total"].tolist(), strict=True))
    assert all(by_time[t] == b for t, b, _ in points)  # each point is a recorded event
    top = max(points, key=lambda p: p[1])
    assert top[1] == found["peak_bytes"] == 5_854_792_192
    assert top[0] == pytest.approx(found["peak_ms"], abs=1e-6)
    assert points[0][1] == events["total"][0] and points[-1][1] == events["total"][-1]
    assert found["held_from_before_step_bytes"] == timeline.held(timeline.peak)[mt.BEFORE]


def test_the_chart_stacks_to_the_allocator_total(events: dict[str, np.ndarray]) -> None:
    timeline = mt.memory_timeline(MeasurementStore(STORE))
    assert timeline is not None
    figure = memory_over_step(timeline)
    stacked = [t for t in figure.data if t.stackgroup == "held"]
    assert len(stacked) == mt.CHART_LAYERS + 2  # 12 layers, the others, before the step
    total = np.sum([np.asarray(t.y) for t in stacked], axis=0) * 2**30
    np.testing.assert_allclose(total, events["total"], rtol=0, atol=1)
    marker = next(t for t in figure.data if t.name == "peak")
    assert marker.y[0] * 2**30 == pytest.approx(5_854_792_192)
    figure.to_html(include_plotlyjs=False)  # renders headless


def test_analyze_prints_and_writes_the_timeline() -> None:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "xsp", "analyze", str(STORE)]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)["analyses"]["memory_timeline"]
    assert section["peak_bytes"] == 5_854_792_192 and len(section["points"]) <= mt.SERIES_POINTS
    assert section["rows"][0]["held_bytes"] >= section["rows"][-1]["held_bytes"] > 0
    text = subprocess.run(
        [*command, "--all", "--rows", "3"], capture_output=True, text=True, env=env
    )
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("allocated, 0-"))
    assert line.endswith("peak 5.5 GiB") and "█" in line and len(line) <= 80
    assert "Memory over the step: layers held at the peak" in text.stdout


def test_a_multi_rank_job_shows_the_rank_that_held_the_most(
    tmp_path: Path, events: dict[str, np.ndarray]
) -> None:
    """Joined ranks' events carry a rank column: the timeline is the rank and device whose
    allocator held the most (here rank 1's copy of rank 0's events, 1 GiB higher)."""
    import shutil

    import pyarrow as pa

    store_dir = tmp_path / "job"
    shutil.copytree(STORE, store_dir)
    path = store_dir / "MF" / "memory.parquet"
    rank0 = pq.read_table(path)
    rank1 = rank0.set_column(
        rank0.schema.get_field_index("total_allocated"),
        "total_allocated",
        pc.add(rank0["total_allocated"], 1 << 30),
    )
    joined = pa.concat_tables(
        [
            t.append_column("rank", pa.array(np.full(t.num_rows, r, np.int64)))
            for r, t in ((0, rank0), (1, rank1))
        ]
    )
    pq.write_table(joined.unify_dictionaries(), path)
    timeline = mt.memory_timeline(MeasurementStore(store_dir))
    assert timeline is not None
    assert timeline.device == "rank 1 GPU 0"
    assert timeline.peak_bytes == 5_854_792_192 + (1 << 30)
    assert len(timeline.total_bytes) == 1365  # rank 1's events alone
    # the same events, so the same layers hold the same bytes; the extra GiB is from before
    assert timeline.held(timeline.peak)[mt.BEFORE] == 314_556_928 + (1 << 30)


def test_the_report_draws_the_step_and_lists_the_layers_held(tmp_path: Path) -> None:
    from xsp.analysis.report import write_report

    out = tmp_path / "report.html"
    write_report(MeasurementStore(STORE), out, "ResNet-50")
    page = out.read_text()
    section = page[page.index("<h2 id='memory_timeline'>") :]
    section = section.split("<h2", 2)[1]  # to the next section, if any
    assert "Plotly.newPlot" in section and "peak 5.5 GiB" in section
    # the table: every layer holding bytes at the peak (111 of them), the largest first
    assert "111 rows: peak 5.5 GiB at 12.073 ms of iteration 0" in section
    assert section.index("layer1.2.bn3") < section.index("layer4.2.conv3")
