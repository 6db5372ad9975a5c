"""Reconstruction on synthetic leveled runs whose true latencies and injected overheads are known.

Truth, per iteration: a 10 ms step; layers conv (3 ms) and two ReLU calls (1 ms each); under conv
two kernels with the same name (2 ms and 0.5 ms). Level F inflates the step by 2 ms; level G
inflates the step by 1 ms more, conv by 0.5 ms and each ReLU by 0.2 ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.fixtures import write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.reconstruction.reconstruct import level_overhead, reconstruct
from xsp.core import schema

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
    """The replay (xsp.analysis.replay): host spans on MF's timeline (no calibration in these
    runs, so MF's own times), kernels with G's durations, launched at their op's start (no L),
    in stream order; the step ends when host and GPU are done."""
    spans, mismatches = reconstruct(measurement)
    assert mismatches.num_rows == 0
    rows = spans.to_pylist()
    by_name: dict[str, list[float]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row["dur_ns"] / MS)
    assert by_name["conv1"] == [pytest.approx(3.0)] * 5
    assert by_name["relu"] == [pytest.approx(1.0)] * 10
    assert sorted(by_name["k"]) == [pytest.approx(0.5)] * 5 + [pytest.approx(2.0)] * 5
    # every host child still fits inside its parent, in its original order
    ids = {r["span_id"]: r for r in rows}
    for row in rows:
        if row["parent_span_id"] and row["level"] != "gpu":
            parent = ids[row["parent_span_id"]]
            assert parent["start_ns"] <= row["start_ns"]
            assert row["start_ns"] + row["dur_ns"] <= parent["start_ns"] + parent["dur_ns"]
    # Iteration 0 by hand: conv at 1 ms (MF), its kernels from its start, one after the other
    # with the 0.2 ms the G run measured between them (1-3 and 3.2-3.7 ms: the second was queued
    # behind the first there, so that gap is the device's); the host's last span ends at 8 ms and the F run's 4 ms after it close
    # the step at 12 ms, MF's own step (its uncalibrated 2 ms of F cost stay in).
    first = [r for r in rows if r["iteration"] == 0]
    conv = next(r for r in first if r["name"] == "conv1")
    assert conv["start_ns"] == 1 * MS
    kernels = sorted((r["start_ns"], r["dur_ns"]) for r in first if r["name"] == "k")
    assert kernels == [(1 * MS, 2 * MS), (int(3.2 * MS), int(0.5 * MS))]
    step = next(r for r in first if r["name"] == "step")
    assert step["dur_ns"] == 12 * MS


def test_the_reconstruction_is_a_trace_of_its_own(measurement: MeasurementStore) -> None:
    spans, _ = reconstruct(measurement)
    measured = set(measurement.table.column("trace_id").to_pylist())
    rebuilt = spans.column("trace_id").to_pylist()
    assert measured.isdisjoint(rebuilt) and len(set(rebuilt)) == 5  # one trace per iteration
    ids = spans.column("span_id").to_pylist()
    assert len(set(zip(rebuilt, ids, strict=True))) == spans.num_rows
    again, _ = reconstruct(MeasurementStore(measurement.root))
    assert again.column("span_id").to_pylist() == ids  # deterministic
    assert again.column("trace_id").to_pylist() == rebuilt


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


DATA = Path(__file__).resolve().parents[1] / "benchmarks/data"


@pytest.mark.parametrize(
    ("measurement", "spans", "activities"),
    [
        ("r50-b64-train", 102_520, 15_820),  # ResNet-50 b64 training, H200
        ("r50-b64-train-cl", None, None),  # the same, channels_last (M and MFLG only)
        ("gpt-lm-train", 54_490, None),  # benchmarks/workloads/gpt_lm_train.py, bf16, H200
    ],
)
def test_reconstructed_gpu_timelines_are_consistent(
    measurement: str, spans: int | None, activities: int | None
) -> None:
    """On real H200 measurements: every span inside its step, no two activities of a stream
    overlapping, every stream's GPU time the G run's, and trace ids of the reconstruction's own."""
    store = MeasurementStore(DATA / measurement)
    rebuilt, mismatches = reconstruct(store)
    assert mismatches.num_rows == 0
    if spans is not None:
        assert rebuilt.num_rows == spans
    rows = rebuilt.to_pydict()
    iteration = np.asarray(rows["iteration"])
    start = np.asarray(rows["start_ns"])
    end = start + np.asarray(rows["dur_ns"])
    kind = np.asarray(rows["kind"], dtype=object)
    step_start = {i: s for i, s, k in zip(iteration, start, kind, strict=True) if k == "step"}
    step_end = {i: e for i, e, k in zip(iteration, end, kind, strict=True) if k == "step"}
    assert all(start >= np.array([step_start[i] for i in iteration]))
    assert all(end <= np.array([step_end[i] for i in iteration]))
    gpu = np.asarray(rows["level"], dtype=object) == "gpu"
    stream = np.asarray([s if s is not None else -1 for s in rows["gpu_stream"]])
    order = np.lexsort((start[gpu], stream[gpu], iteration[gpu]))
    lane = np.stack([iteration[gpu][order], stream[gpu][order]])
    same = (lane[:, 1:] == lane[:, :-1]).all(axis=0)
    assert not (same & (start[gpu][order][1:] < end[gpu][order][:-1])).any()
    if activities is not None:
        assert int(gpu.sum()) == activities
    deepest = max(range(len(store.runs)), key=lambda i: len(store.runs[i].levels))
    measured = store.run_spans(deepest).to_pydict()
    measured_gpu = sum(
        d for d, lv in zip(measured["dur_ns"], measured["level"], strict=True) if lv == "gpu"
    )
    assert int(np.asarray(rows["dur_ns"])[gpu].sum()) == measured_gpu
    assert set(rows["trace_id"]).isdisjoint(store.table.column("trace_id").to_pylist())
