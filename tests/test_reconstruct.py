"""Reconstruction on synthetic leveled runs whose true latencies and injected overheads are known.

Truth, per iteration: a 10 ms step; layers conv (3 ms) and two ReLU calls (1 ms each); under conv
two kernels with the same name (2 ms and 0.5 ms). Level F inflates the step by 2 ms; level G
inflates the step by 1 ms more, conv by 0.5 ms and each ReLU by 0.2 ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from analysis.reconstruct import level_overhead, reconstruct
from analysis.store import MeasurementStore
from tests.fixtures import write_run
from tracer import schema

MS = 1_000_000


def _run(base: Path, levels: str, iterations: int = 5) -> None:
    rows: list[dict[str, Any]] = []
    next_id = 1

    def span(
        parent: int, name: str, level: str, kind: str, start: float, dur: float, it: int
    ) -> int:
        nonlocal next_id
        rows.append(
            {
                "trace_id": it.to_bytes(16, "big"),
                "span_id": next_id,
                "parent_span_id": parent,
                "name": name,
                "level": level,
                "kind": kind,
                "iteration": it,
                "start_ns": int(start * MS),
                "dur_ns": int(dur * MS),
            }
        )
        next_id += 1
        return next_id - 1

    gpu = "G" in levels
    for it in range(iterations):
        t = it * 100.0
        step = 10 + (2 if "F" in levels else 0) + (1 if gpu else 0)
        root = span(0, "step", "model", "step", t, step, it)
        if "F" not in levels:
            continue
        conv = span(root, "conv1", "framework", "module", t + 1, 3.5 if gpu else 3, it)
        span(root, "relu", "framework", "module", t + 5, 1.2 if gpu else 1, it)
        span(root, "relu", "framework", "module", t + 7, 1.2 if gpu else 1, it)
        if gpu:
            span(conv, "k", "gpu", "kernel", t + 1.2, 2, it)
            span(conv, "k", "gpu", "kernel", t + 3.4, 0.5, it)
    write_run(base, levels, pa.Table.from_pylist(rows, schema=schema.SPAN_SCHEMA))


@pytest.fixture
def measurement(tmp_path: Path) -> MeasurementStore:
    for levels in ("M", "MF", "MFG"):
        _run(tmp_path, levels)
    return MeasurementStore(tmp_path)


def test_each_span_takes_its_own_levels_timing(measurement: MeasurementStore) -> None:
    spans, mismatches = reconstruct(measurement)
    assert mismatches.num_rows == 0
    rows = spans.to_pylist()
    by_name: dict[str, list[float]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row["dur_ns"] / MS)
    assert by_name["step"] == [pytest.approx(10.0, rel=0.02)] * 5
    assert by_name["conv1"] == [pytest.approx(3.0, rel=0.02)] * 5
    assert by_name["relu"] == [pytest.approx(1.0, rel=0.02)] * 10
    assert sorted(by_name["k"]) == [pytest.approx(0.5)] * 5 + [pytest.approx(2.0)] * 5
    # every child still fits inside its parent, in its original order
    ids = {r["span_id"]: r for r in rows}
    for row in rows:
        if row["parent_span_id"]:
            parent = ids[row["parent_span_id"]]
            assert parent["start_ns"] <= row["start_ns"]
            assert row["start_ns"] + row["dur_ns"] <= parent["start_ns"] + parent["dur_ns"]


def test_overhead_per_level_matches_what_was_injected(measurement: MeasurementStore) -> None:
    table = {(r["level"], r["run"]): r for r in level_overhead(measurement).to_pylist()}
    assert table[("model", "MF")]["trimmed_mean_added_ms"] == pytest.approx(2.0)
    assert table[("model", "MFG")]["trimmed_mean_added_ms"] == pytest.approx(3.0)
    framework = table[("framework", "MFG")]
    assert framework["spans"] == 15
    assert framework["p90_added_ms"] == pytest.approx(0.5)  # conv; the ReLUs added 0.2
    assert framework["p50_added_ms"] == pytest.approx(0.2)


def test_a_structure_that_differs_is_reported(tmp_path: Path) -> None:
    _run(tmp_path, "M")
    _run(tmp_path, "MF", iterations=5)
    _run(tmp_path, "MFG", iterations=6)  # one iteration more than the framework run has
    _, mismatches = reconstruct(MeasurementStore(tmp_path))
    assert set(mismatches.column("iteration").to_pylist()) == {5}
