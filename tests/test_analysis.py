"""Analyses on stores built from the real captures; expected numbers are ResNet-18's own:
76 layer calls per forward, 60 of them leaves (20 Conv2d, 20 BatchNorm2d, 17 ReLU calls,
1 MaxPool2d, 1 AdaptiveAvgPool2d, 1 Linear)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.kernels import kernels_by_name, temporal_breakdown, union_length
from analysis.layers import layer_info, layer_latency, layer_types
from analysis.store import MeasurementStore
from tests.fixtures import fixture_table, write_run


def _store(root: Path, scenario: str, levels: str) -> MeasurementStore:
    write_run(root, levels, fixture_table(scenario, levels))
    return MeasurementStore(root)


def test_layer_analyses(tmp_path: Path) -> None:
    measurement = _store(tmp_path, "resnet18_train_cpu", "MF")
    info = layer_info(measurement).to_pylist()
    assert len(info) == 76
    assert info[0]["module_path"] == "" and info[0]["input_shapes"] == "[[2,3,224,224]]"
    assert info[1]["module_path"] == "conv1" and info[1]["params"] == 9408
    latency = layer_latency(measurement).to_pylist()
    assert len(latency) == 60 and latency[0]["module_path"] == "conv1"
    assert [r["call_index"] for r in latency] == list(range(60))
    assert all(r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in latency)
    types = {r["module_type"]: r for r in layer_types(measurement).to_pylist()}
    calls = {t: r["calls_per_iteration"] for t, r in types.items()}
    assert calls == {
        "Conv2d": 20,
        "BatchNorm2d": 20,
        "ReLU": 17,
        "MaxPool2d": 1,
        "AdaptiveAvgPool2d": 1,
        "Linear": 1,
    }
    assert sum(r["share_pct"] for r in types.values()) == pytest.approx(100)


def test_kernel_analyses(tmp_path: Path) -> None:
    measurement = _store(tmp_path, "resnet18_train_mlg_cuda", "MLG")
    kernels = kernels_by_name(measurement, limit=1000).to_pylist()
    assert sum(r["calls_per_iteration"] for r in kernels) == 324
    assert sum(r["share_pct"] for r in kernels) == pytest.approx(100)
    assert kernels == sorted(kernels, key=lambda r: -r["share_pct"])
    (row,) = temporal_breakdown(measurement).to_pylist()
    assert 0 < row["gpu_busy_ms"] <= row["step_ms"]
    assert row["gpu_busy_ms"] + row["gpu_idle_ms"] == pytest.approx(row["step_ms"])


def test_union_length_counts_overlap_once() -> None:
    starts, ends = np.array([5, 0, 20, 21]), np.array([15, 10, 25, 22])
    assert union_length(starts, ends) == 15 + 5
    assert union_length(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == 0
