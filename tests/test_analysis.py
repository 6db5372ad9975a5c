"""Analyses on stores built from the real captures; expected numbers are ResNet-18's own:
76 layer calls per forward, 60 of them leaves (20 Conv2d, 20 BatchNorm2d, 17 ReLU calls,
1 MaxPool2d, 1 AdaptiveAvgPool2d, 1 Linear)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore, text_codes, text_equals, text_in
from xsp.analysis.tables.kernels import kernels_by_name, temporal_breakdown, union_length
from xsp.analysis.tables.layers import layer_info, layer_latency, layer_types


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


H200_STORE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "r50-b64-train"


def test_kernel_attribution_and_hta_breakdowns_on_the_mflg_capture(tmp_path: Path) -> None:
    from xsp.analysis.tables import kernels

    measurement = _store(tmp_path, "resnet18_train_mflg_cuda", "MFLG")
    by_layer = {r["layer"]: r for r in kernels.kernels_by_layer(measurement, 100).to_pylist()}
    assert by_layer["conv1"]["kernels_per_iteration"] >= 2  # forward and backward convolutions
    assert "conv" in by_layer["conv1"]["top_kernel"].lower()
    per_layer = kernels.gpu_time_per_layer(measurement, 100).to_pylist()
    assert {r["type"] for r in per_layer} >= {"Conv2d", "BatchNorm2d", "Linear"}
    assert all(0.0 <= r["gpu_pct"] <= 100.0 and r["non_gpu_ms"] >= 0.0 for r in per_layer)
    (launch,) = kernels.launch_statistics(measurement).to_pylist()
    assert launch["kernels"] == 324 and launch["median_delay_us"] > 0
    # a total over the run's iterations, beside its per-iteration figure
    assert launch["kernels_per_iteration"] == 324 / launch["iterations"]
    buckets = kernels.kernel_duration_distribution(measurement).to_pylist()
    assert sum(b["kernels"] for b in buckets) == 324
    assert abs(sum(b["share_of_time_pct"] for b in buckets) - 100.0) < 1e-6
    (idle,) = kernels.idle_breakdown(measurement).to_pylist()
    assert idle["idle_ms"] > 0
    assert abs(idle["host_wait_ms"] + idle["kernel_wait_ms"] - idle["idle_ms"]) < 1e-9
    busy = kernels.temporal_breakdown(measurement).to_pylist()[0]
    assert idle["idle_ms"] <= busy["step_ms"]
    from xsp.analysis.tables.library import library_calls

    calls = {(r["library"], r["call"]): r for r in library_calls(measurement, 50).to_pylist()}
    conv = calls[("cuDNN", "cudnnBackendExecute")]
    assert conv["calls_per_iteration"] == 59 and conv["ms_per_iteration"] > 0
    assert ("cuBLAS", "cublasLtMatmul") in calls


def test_h200_resnet50_reconstruction_takes_model_latency_from_the_m_run() -> None:
    """Acceptance data from the H200 (ResNet-50 b64 training, 20 iterations per level set):
    every span of the MFLG run finds its counterpart, the reconstructed steps are the replay's,
    and the replay is checked against the M run's median step (32.762 ms over its 19 steady steps)."""
    from xsp.analysis.reconstruction.reconstruct import level_overhead, reconstruct

    measurement = MeasurementStore(H200_STORE)
    spans, mismatches = reconstruct(measurement)
    assert mismatches.num_rows == 0 and spans.num_rows == 102_520
    steps = sorted(r["dur_ns"] for r in spans.to_pylist() if r["kind"] == "step")
    m_steps = sorted(
        measurement.sql("SELECT dur_ns FROM spans WHERE levels = 'M' AND kind = 'step'")
        .column("dur_ns")
        .to_pylist()
    )
    from xsp.analysis.replay import replay

    result = replay(measurement)
    assert steps == sorted(result.steps.column("replayed_ms").to_numpy() * 1e6 // 1)
    found = result.summary()
    assert found["measured_run"] == "M" and len(m_steps) == 20
    assert found["measured_step_ms"] == pytest.approx(32.762, abs=0.001)
    # op details the NVTX-captured MFLG run lacks (dtypes) come from the MF run
    convs = [r for r in spans.to_pylist() if r["op_name"] == "aten::conv2d"]
    assert convs and all(r["input_dtypes"].startswith("float,float") for r in convs)
    deep_dtypes = measurement.sql(
        "SELECT count(input_dtypes) AS n FROM spans WHERE levels = 'MFLG' AND kind = 'op'"
    )
    assert deep_dtypes.column("n")[0].as_py() == 0
    overhead = {(r["level"], r["run"]): r for r in level_overhead(measurement).to_pylist()}
    assert overhead[("model", "MF")]["p50_added_ms"] > 0  # F inflates the step
    assert overhead[("framework", "MFLG")]["spans"] == 53_820


def test_the_notes_name_which_step_the_gains_are_shares_of_and_why_memory_is_empty(
    tmp_path: Path,
) -> None:
    from xsp.analysis.catalog import sections

    def notes(store: MeasurementStore) -> dict[str, str]:
        return {s.key: s.note for s in sections(store)}

    alone = notes(_store(tmp_path / "MF", "resnet18_train_cpu", "MF"))
    assert "the MF run's traced step (no M run" in alone["suggestions"]
    assert (
        alone["memory"]
        == "no allocator events: its runs with level F recorded none (no memory.parquet)"
    )
    leveled = notes(MeasurementStore(H200_STORE))  # M, MF, MFL, MFLG
    assert "the untraced step (M)" in leveled["suggestions"]
    m_only = notes(_store(tmp_path / "M", "resnet18_train_cpu", "M"))
    assert m_only["memory"] == "no allocator events: the measurement has no run with level F"


def test_gpu_time_per_layer_takes_latency_from_the_shallowest_framework_run() -> None:
    """A13 on the H200 ResNet-50 measurement: a layer's latency is MF's (the least overhead
    with F), its GPU time the G run's."""
    from xsp.analysis.tables.kernels import gpu_time_per_layer

    measurement = MeasurementStore(H200_STORE)
    conv1 = {r["layer"]: r for r in gpu_time_per_layer(measurement, limit=100).to_pylist()}["conv1"]
    mf = measurement.sql(
        """SELECT sum(dur_ns) / count(DISTINCT iteration) / 1e6 AS ms FROM spans
           WHERE levels = 'MF' AND kind = 'module' AND phase = 'forward' AND module_path = 'conv1'"""
    )
    assert conv1["latency_ms"] == pytest.approx(mf.column("ms")[0].as_py())


def test_the_summarys_slowest_layers_come_from_the_shallowest_framework_run() -> None:
    """The summary's layers and A3's latency are MF's, the least overhead with F (conv1's
    forward median: MF 0.361 ms, MFL 0.390, MFLG 0.314 in this capture of the NVTX era)."""
    from xsp.analysis.tables.summary import top_layers

    measurement = MeasurementStore(H200_STORE)
    (conv1,) = [r for r in layer_latency(measurement).to_pylist() if r["module_path"] == "conv1"]
    mf_median = measurement.sql(
        """SELECT median(dur_ns) / 1e6 AS ms FROM spans WHERE levels = 'MF' AND kind = 'module'
           AND phase = 'forward' AND module_path = 'conv1'"""
    )
    assert conv1["median_ms"] == pytest.approx(mf_median.column("ms")[0].as_py())
    top = top_layers(measurement, limit=1).to_pylist()[0]
    mf = measurement.sql(
        f"""SELECT avg(dur_ns) / 1e6 AS ms FROM spans WHERE levels = 'MF' AND kind = 'module'
            AND phase = 'forward' AND module_path = '{top["module_path"]}'"""
    )
    assert top["mean_ms"] == pytest.approx(mf.column("ms")[0].as_py())


REPLAY_R50 = Path(__file__).resolve().parents[1] / "benchmarks/data/replay-h200/r50-b64-train"


def test_the_time_line_sums_the_manifests_phases_over_its_level_sets() -> None:
    """The committed H200 measurement's manifest (M, MF, MFLG): start-up 7.071 + 7.539 + 10.412
    = 25.022 s of the processes' 8.617 + 10.250 + 13.819 = 32.686 s (76.6%); warm-up 0.710 +
    0.707 + 0.751 = 2.168 s; levels on 0.004 + 0.842 + 1.191 = 2.037 s; traced 0.716 + 0.749 +
    0.952 = 2.417 s; finish (stop, drain, convert, store) 0.012 + 0.182 + 0.290 + 0.212 =
    0.696 s; exit 0.094 + 0.141 + 0.111 = 0.346 s."""
    import json

    from xsp.analysis.tables.summary import time_by_phase, time_line
    from xsp.core.store import Manifest

    manifest = json.loads((REPLAY_R50 / "manifest.json").read_text())
    rows = time_by_phase(Manifest.from_json(manifest)).to_pylist()
    assert [r["phase"] for r in rows] == [
        "start-up",
        "warm-up",
        "levels on",
        "traced",
        "finish",
        "exit",
    ]
    expected = [25.022, 2.168, 2.037, 2.417, 0.696, 0.346]
    assert [r["seconds"] for r in rows] == pytest.approx(expected)
    assert [r["share_pct"] for r in rows] == pytest.approx([100 * s / 32.686 for s in expected])
    assert time_line(Manifest.from_json(manifest)) == (
        "time: 3 level-set processes 32.7 s: start-up 25.0 s (77%), warm-up 2.2 s (7%), "
        "levels on 2.0 s (6%), traced 2.4 s (7%), finish 0.7 s (2%), exit 0.3 s (1%)"
    )
    # a manifest that records the measurement's end says the whole too (processes overlapped)
    ended = {**manifest, "finished_ns": manifest["created_ns"] + 30_040_000_000}
    said = time_line(Manifest.from_json(ended)) or ""
    assert said.startswith("time: 30.0 s in all; 3 level-set processes 32.7 s: start-up 25.0 s")
    # a level set started ahead of its turn (overlap) waited for the one before: its own phase
    waited = json.loads(json.dumps(manifest))
    waited["runs"][1]["seconds"]["waiting_for_previous"] = 1.5
    waited["runs"][1]["seconds"]["total"] += 1.5
    assert [r["phase"] for r in time_by_phase(Manifest.from_json(waited)).to_pylist()][
        2
    ] == "waiting"
    # F's calibration, split off a switch-on whose parts run.json has: a phase of its own
    calibrated = json.loads(json.dumps(manifest))
    calibrated["runs"][1]["seconds"].update(calibration=0.8, switch_on=0.042)
    found = {
        r["phase"]: r["seconds"] for r in time_by_phase(Manifest.from_json(calibrated)).to_pylist()
    }
    assert list(found)[2:4] == ["F's calibration", "levels on"]
    assert found["F's calibration"] == pytest.approx(0.8)
    assert found["levels on"] == pytest.approx(0.004 + 0.042 + 1.191)
    # MF run after M in M's process: the processes are counted as many as there are
    shared = json.loads(json.dumps(manifest))
    shared["runs"][1]["in_process_of"] = "M"
    assert (time_line(Manifest.from_json(shared)) or "").startswith(
        "time: 3 level sets in 2 processes 32.7 s: "
    )
    two = {**shared, "runs": shared["runs"][:2]}  # M and MF alone: one process
    assert (time_line(Manifest.from_json(two)) or "").startswith(
        "time: 2 level sets in 1 process 18.9 s: "
    )
    # runs without phase seconds (a manifest older than them): no line
    older = json.loads((REPLAY_R50.parent.parent / "r50-b64-train/manifest.json").read_text())
    assert (
        time_by_phase(Manifest.from_json(older)).num_rows == 0
        and time_line(Manifest.from_json(older)) is None
    )


def test_text_tests_and_codes_read_each_chunks_dictionary_and_leave_nulls_out() -> None:
    import pyarrow as pa

    # two chunks with dictionaries of their own (two span files), and a chunk of plain text
    column = pa.chunked_array(
        [
            pa.array(["op", None, "kernel", "op"]).dictionary_encode(),
            pa.array(["kernel", "step", None]).dictionary_encode(),
        ]
    )
    assert text_equals(column, "op").tolist() == [True, False, False, True, False, False, False]
    assert text_in(column, ["kernel", "step"]).tolist() == [0, 0, 1, 0, 1, 1, 0]
    code, texts = text_codes(column)
    assert [texts[c] if c >= 0 else None for c in code] == [
        "op",
        None,
        "kernel",
        "op",
        "kernel",
        "step",
        None,
    ]
    assert text_equals(pa.array(["a", None, "b"]), "b").tolist() == [False, False, True]


def test_hta_breakdowns_read_the_replayed_step_not_the_traced_run() -> None:
    """The report's HTA-style sections describe the untraced step the replay rebuilt: on the
    r50 b64 training store the traced MFLG steps are 39-57 ms with the GPU busy 54-80%, the
    replayed ones 32.7-37.2 ms (median 32.97) with it busy 84-95%; the kernels are the same 737
    a step."""
    from xsp.analysis.catalog import sections

    found = {s.key: s for s in sections(MeasurementStore(REPLAY_R50))}
    temporal = found["temporal_breakdown"]
    assert "replayed, untraced step" in temporal.note
    steps = temporal.table.column("step_ms").to_pylist()
    busy = temporal.table.column("busy_pct").to_pylist()
    assert len(steps) == 20 and all(32.5 < ms < 37.5 for ms in steps)
    assert 32.9 < sorted(steps)[10] < 33.0 and all(83 < pct < 96 for pct in busy)
    traced = temporal_breakdown(MeasurementStore(REPLAY_R50)).to_pylist()
    assert max(r["step_ms"] for r in traced) > 39 and min(r["busy_pct"] for r in traced) < 80
    (launch,) = found["launch_statistics"].table.to_pylist()
    assert launch["kernels_per_iteration"] == 737 and launch["iterations"] == 20
    assert "replayed" in found["idle_breakdown"].note
