"""Each suggestion rule on a trace that has its pattern and on one that does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.suggestions.rules import (
    fp32_matmuls_on_gpu,
    host_syncs,
    index_select,
    launch_bound,
    layout_transposes,
    suggest,
)
from xsp.core import schema

TRACE = b"\x01" * 16


def _write(root: Path, levels: str, table: pa.Table, device: str = "cuda") -> MeasurementStore:
    write_run(root, levels, table, {"xsp.device": device})
    return MeasurementStore(root)


def _fixture(root: Path, scenario: str, levels: str, device: str) -> MeasurementStore:
    return _write(root, levels, fixture_table(scenario, levels), device)


def _synthetic(root: Path, levels: str, spans: list[dict[str, Any]]) -> MeasurementStore:
    """One iteration: a 1 ms step (span 1) and ``spans`` under it."""
    rows = [
        {
            "trace_id": TRACE,
            "span_id": 1,
            "parent_span_id": 0,
            "name": "step",
            "start_ns": 0,
            "dur_ns": 1_000_000,
            "level": "model",
            "iteration": 0,
            "kind": "step",
        }
    ]
    for i, span in enumerate(spans):
        rows.append(
            {"trace_id": TRACE, "span_id": i + 2, "parent_span_id": 1, "iteration": 0, **span}
        )
    return _write(root, levels, pa.Table.from_pylist(rows, schema=schema.SPAN_SCHEMA))


def _kernels(count: int, dur_ns: int) -> list[dict[str, Any]]:
    return [
        {"name": "k", "level": "gpu", "kind": "kernel", "start_ns": i * 10_000, "dur_ns": dur_ns}
        for i in range(count)
    ]


def test_layout_transposes(tmp_path: Path) -> None:
    found = layout_transposes(_fixture(tmp_path / "g", "resnet18_train_mlg_cuda", "MLG", "cuda"))
    assert found is not None and found.rule == "layout-transposes"
    assert found.evidence.endswith("nchwToNhwc/nhwcToNchw kernels per iteration")
    assert found.gain_ms_per_iteration and found.gain_ms_per_iteration > 0
    assert layout_transposes(_synthetic(tmp_path / "s", "MG", _kernels(5, 50_000))) is None


def _tree(
    root: Path, levels: str, spans: list[tuple[int, int, dict[str, Any]]]
) -> MeasurementStore:
    """One 1 ms step (span 1) and ``spans`` as (span id, parent id, fields)."""
    rows = [
        {"trace_id": TRACE, "span_id": 1, "parent_span_id": 0, "name": "step", "start_ns": 0,
         "dur_ns": 1_000_000, "level": "model", "iteration": 0, "kind": "step"},
    ]  # fmt: skip
    rows += [
        {"trace_id": TRACE, "span_id": i, "parent_span_id": parent, "iteration": 0, **fields}
        for i, parent, fields in spans
    ]
    return _write(root, levels, pa.Table.from_pylist(rows, schema=schema.SPAN_SCHEMA))


def _op(name: str, dtypes: str, start: int, dur: int) -> dict[str, Any]:
    return {"name": name, "op_name": name, "input_dtypes": dtypes, "level": "framework",
            "kind": "op", "start_ns": start, "dur_ns": dur}  # fmt: skip


def _kernel(name: str, start: int, dur: int) -> dict[str, Any]:
    return {"name": name, "level": "gpu", "kind": "kernel", "start_ns": start, "dur_ns": dur}


def test_fp32_math_is_judged_by_its_kernels_not_by_its_ops_dtypes(tmp_path: Path) -> None:
    """Of three fp32-input ops, only the GEMM whose kernel runs fp32 FMAs is evidence: cuDNN's
    convolution runs TF32 (its kernel says so), and autocast's outer addmm runs a bf16 addmm."""
    spans = [
        (2, 1, _op("aten::mm", "float,float", 0, 250_000)),
        (3, 2, _kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_ffma_kernel", 10_000, 200_000)),
        (4, 1, _op("aten::convolution", "float,float,float", 300_000, 350_000)),
        (5, 4, _kernel("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32", 310_000, 300_000)),
        (6, 1, _op("aten::addmm", "float,float,float,Scalar,Scalar", 700_000, 200_000)),
        (7, 6, _op("aten::addmm", "c10::BFloat16,c10::BFloat16,c10::BFloat16", 720_000, 150_000)),
        (8, 7, _kernel("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_bias_NNT", 730_000, 100_000)),
    ]
    found = fp32_matmuls_on_gpu(_tree(tmp_path / "g", "MFLG", spans))
    assert found is not None
    assert found.evidence == "1 fp32 CUDA-core kernels of convolutions and GEMMs per iteration"
    assert found.gain_ms_per_iteration == pytest.approx(0.2)
    assert found.share_pct == pytest.approx(20.0)
    # tensor cores everywhere: nothing to suggest
    fast = [s for s in spans if s[0] not in (2, 3)]
    assert fp32_matmuls_on_gpu(_tree(tmp_path / "t", "MFLG", fast)) is None


def test_fp32_gemms_without_kernels_count_by_pytorchs_defaults(tmp_path: Path) -> None:
    """No G: the innermost fp32 GEMM ops' host time (matmul TF32 is off by default); the
    convolution (cuDNN TF32 on by default) and autocast's outer addmm are left out."""
    spans = [
        (2, 1, _op("aten::mm", "float,float", 0, 250_000)),
        (4, 1, _op("aten::convolution", "float,float,float", 300_000, 350_000)),
        (6, 1, _op("aten::addmm", "float,float,float,Scalar,Scalar", 700_000, 200_000)),
        (7, 6, _op("aten::addmm", "c10::BFloat16,c10::BFloat16,c10::BFloat16", 720_000, 150_000)),
    ]
    found = fp32_matmuls_on_gpu(_tree(tmp_path / "g", "MF", spans))
    assert found is not None and found.evidence == "1 fp32 GEMM ops per iteration"
    assert found.gain_ms_per_iteration == pytest.approx(0.25)
    cpu = _write(tmp_path / "c", "MF", fixture_table("resnet18_train_cpu", "MF"), "cpu")
    assert fp32_matmuls_on_gpu(cpu) is None


def test_launch_bound(tmp_path: Path) -> None:
    found = launch_bound(_synthetic(tmp_path / "a", "MG", _kernels(100, 2_000)))  # 20% busy
    assert found is not None and found.gain_ms_per_iteration == pytest.approx(0.8)
    assert (
        launch_bound(
            _synthetic(
                tmp_path / "c",
                "MG",
                [
                    {
                        "name": "k",
                        "level": "gpu",
                        "kind": "kernel",
                        "start_ns": i * 100_000,
                        "dur_ns": 90_000,
                    }
                    for i in range(10)
                ],
            )
        )
        is None
    )


def test_host_syncs(tmp_path: Path) -> None:
    sync = [
        {
            "name": "cudaStreamSynchronize",
            "level": "library",
            "kind": "runtime",
            "start_ns": 10,
            "dur_ns": 200_000,
        }
    ]
    found = host_syncs(_synthetic(tmp_path / "a", "MLG", sync))
    assert found is not None and found.gain_ms_per_iteration == pytest.approx(0.2)
    assert found.share_pct == pytest.approx(20.0)
    launch = [{**sync[0], "name": "cudaLaunchKernel"}]
    assert host_syncs(_synthetic(tmp_path / "b", "MLG", launch)) is None


def test_index_select(tmp_path: Path) -> None:
    index = [
        {
            "name": "aten::index",
            "op_name": "aten::index",
            "level": "framework",
            "kind": "op",
            "start_ns": 10,
            "dur_ns": 30_000,
        }
    ]
    assert index_select(_synthetic(tmp_path / "a", "MF", index)) is not None
    select = [{**index[0], "name": "aten::index_select", "op_name": "aten::index_select"}]
    assert index_select(_synthetic(tmp_path / "b", "MF", select)) is None


def test_suggest_orders_by_gain(tmp_path: Path) -> None:
    spans = [
        *_kernels(100, 2000),
        {
            "name": "cudaStreamSynchronize",
            "level": "library",
            "kind": "runtime",
            "start_ns": 10,
            "dur_ns": 100000,
        },
    ]
    table = suggest(_synthetic(tmp_path, "MLG", spans)).to_pylist()
    assert [r["rule"] for r in table] == ["launch-bound", "host-syncs"]


def test_layout_transposes_fire_for_nchw_resnet50_and_not_for_channels_last() -> None:
    """Acceptance data from the H200: ResNet-50 b64 fp32 training, NCHW against channels_last."""
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    nchw = {r["rule"]: r for r in suggest(MeasurementStore(data / "r50-b64-train")).to_pylist()}
    assert "layout-transposes" in nchw and nchw["layout-transposes"]["gain_ms_per_iteration"] > 1
    assert "fp32-on-tensor-cores" not in nchw  # TF32 already: fp32 FMA kernels are 0.2%
    nhwc = {r["rule"] for r in suggest(MeasurementStore(data / "r50-b64-train-cl")).to_pylist()}
    assert "layout-transposes" not in nhwc


def _leveled(root: Path, traced_step_ns: int, spans: list[dict[str, Any]]) -> MeasurementStore:
    """M with its untraced 1 ms step, and MG whose step tracing stretched to ``traced_step_ns``."""
    _synthetic(root, "M", [])
    _synthetic(root, "MG", spans)
    table = MeasurementStore(root).run_spans(1).to_pylist()
    table[0]["dur_ns"] = traced_step_ns
    write_run(root, "MG", pa.Table.from_pylist(table, schema=schema.SPAN_SCHEMA), {})
    return MeasurementStore(root)


def test_gains_are_measured_on_the_untraced_step(tmp_path: Path) -> None:
    """100 kernels of 2 µs: the traced step (3 ms) would make the idle GPU 2.8 ms; the untraced
    step (M: 1 ms) leaves 0.8 ms idle, the most a CUDA graph could save."""
    found = launch_bound(_leveled(tmp_path, 3_000_000, _kernels(100, 2_000)))
    assert found is not None
    assert found.gain_ms_per_iteration == pytest.approx(0.8)
    assert found.share_pct == pytest.approx(80.0)
    assert "busy 20% of the untraced step" in found.evidence


@pytest.mark.parametrize(
    ("measurement", "rules"),
    [
        ("r50-b64-train", {"layout-transposes"}),  # its fp32 FMA kernels take 0.2%
        ("r50-b64-train-cl", set()),  # channels_last; no MF run, so no dtypes for the fp32 rule
        ("gpt-lm-train", set()),  # autocast's fp32 addmm ops each run a bf16 addmm
    ],
)
def test_no_gain_exceeds_the_step_on_the_committed_gpu_measurements(
    measurement: str, rules: set[str]
) -> None:
    store = MeasurementStore(Path(__file__).resolve().parents[1] / "benchmarks/data" / measurement)
    steps = store.sql(
        "SELECT avg(dur_ns) / 1e6 AS ms FROM spans WHERE levels = 'M' AND kind = 'step'"
    )
    step_ms = steps.column("ms")[0].as_py()
    found = suggest(store).to_pylist()
    assert {row["rule"] for row in found} == rules
    for row in found:
        assert 0 < row["gain_ms_per_iteration"] <= step_ms, row
        assert 0 < row["share_pct"] <= 100, row
