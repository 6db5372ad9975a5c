"""Algorithmic FLOPs (``xsp.analysis.tables.flops``): the formulas against torch.utils.flop_counter's on
the same shapes, the counts of the committed H200 measurements worked out by hand, executed
FLOPs against them in A8, A12 and A15, and achieved TFLOP/s and MFU from G's durations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xsp.analysis.catalog import FLOP_KEYS, sections
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables import counters, flops, utilization
from xsp.analysis.tables.flop_formulas import FORMULAS, Context

ROOT = Path(__file__).resolve().parents[1]
#: ResNet-50 b64 fp32 training on the H200 with a counter run (M, MF, MFLG, MH).
COUNTED = ROOT / "benchmarks/data/r50-b64-train-counters"
#: The GPT training script (bf16 autocast) on the H200, shapes in its MFLG run.
GPT = ROOT / "benchmarks/data/replay-h200/gpt-lm-train"
#: The same workload recorded when shapes came from the MF run, not the G run.
GPT_SHAPES_IN_MF = ROOT / "benchmarks/data/gpt-lm-train"
#: ResNet-50 b1 fp32 inference on the H200: no backward to take a convolution's output from.
INFERENCE = ROOT / "benchmarks/data/replay-h200/r50-b1-infer"
CALIBRATION = ROOT / "benchmarks/results/counter-calibration-h200.json"


@pytest.fixture(scope="module")
def counted_store() -> MeasurementStore:
    return MeasurementStore(COUNTED)


@pytest.fixture(scope="module")
def gpt() -> MeasurementStore:
    return MeasurementStore(GPT)


# -- the formulas, against torch.utils.flop_counter on the same shapes -------------------------

MATMULS = [
    ("mm", [[64, 1000], [1000, 2048]]),
    ("addmm", [[1000], [64, 2048], [2048, 1000], [], []]),
    ("bmm", [[12, 256, 64], [12, 64, 256]]),
    ("baddbmm", [[12, 256, 256], [12, 256, 64], [12, 64, 256], [], []]),
]
#: (input, weight, output, transposed) of ResNet-50's conv1, a grouped 3x3, a 1-D and a
#: transposed 2-D convolution.
CONVOLUTIONS = [
    ([64, 3, 224, 224], [64, 3, 7, 7], [64, 64, 112, 112], False),
    ([8, 64, 56, 56], [64, 2, 3, 3], [8, 64, 56, 56], False),
    ([4, 16, 100], [32, 16, 5], [4, 32, 96], False),
    ([2, 32, 14, 14], [32, 16, 4, 4], [2, 16, 28, 28], True),
]
#: (query, key, value) shapes: GPT's heads, and grouped-query attention with 2 key heads.
ATTENTION = [
    ([16, 8, 256, 64], [16, 8, 256, 64], [16, 8, 256, 64]),
    ([2, 8, 128, 64], [2, 2, 512, 64], [2, 2, 512, 32]),
]


@pytest.fixture(scope="module")
def torch_registry():  # type: ignore[no-untyped-def]
    flop_counter = pytest.importorskip("torch.utils.flop_counter")
    import torch

    return torch.ops.aten, flop_counter.flop_registry


@pytest.mark.parametrize(("op", "shapes"), MATMULS)
def test_matmuls_count_as_torch_counts_them(torch_registry, op: str, shapes) -> None:  # type: ignore[no-untyped-def]
    aten, registry = torch_registry
    ours = FORMULAS[f"aten::{op}"].flops(shapes, Context())
    theirs = registry[getattr(aten, op)](*[tuple(s) for s in shapes if s])
    assert ours == theirs


@pytest.mark.parametrize(("x", "w", "out", "transposed"), CONVOLUTIONS)
def test_convolutions_count_as_torch_counts_them(torch_registry, x, w, out, transposed) -> None:  # type: ignore[no-untyped-def]
    aten, registry = torch_registry
    ours = FORMULAS["aten::convolution"].flops([x, w, [], [], [], []], Context(out, transposed))
    theirs = registry[aten.convolution](x, w, None, 1, 0, 1, transposed, out_val=out)
    assert ours == theirs
    # the backward with both gradients (output_mask is not recorded: both are counted)
    grad = FORMULAS["aten::convolution_backward"].flops([out, x, w], Context(None, transposed))
    expected = registry[aten.convolution_backward](
        out, x, w, None, 1, 0, 1, transposed, 0, 1, [True, True, False], out_val=(x, w, None)
    )
    assert grad == expected


@pytest.mark.parametrize(("q", "k", "v"), ATTENTION)
def test_attention_counts_as_torch_counts_it(torch_registry, q, k, v) -> None:  # type: ignore[no-untyped-def]
    aten, registry = torch_registry
    forward = FORMULAS["aten::_scaled_dot_product_flash_attention"]
    backward = FORMULAS["aten::_scaled_dot_product_flash_attention_backward"]
    out = [*q[:3], v[3]]
    assert forward.flops([q, k, v], Context()) == registry[
        aten._scaled_dot_product_flash_attention
    ](q, k, v)
    assert backward.flops([out, q, k, v], Context()) == registry[
        aten._scaled_dot_product_flash_attention_backward
    ](out, q, k, v)


def test_shapes_that_do_not_fit_count_nothing() -> None:
    mm = FORMULAS["aten::mm"]
    assert mm.flops([[64, 1000], [999, 2048]], Context()) is None  # inner dimensions differ
    assert mm.flops([[64, 1000]], Context()) is None  # an input short
    conv = FORMULAS["aten::convolution"]
    assert conv.flops([[1, 3, 8, 8], [4, 3, 3, 3]], Context()) is None  # no output shape


def test_a_norm_is_fvcores_estimate() -> None:
    layer_norm = FORMULAS["aten::layer_norm"]
    assert layer_norm.flops([[16, 256, 512], [], [512], [512]], Context()) == 5 * 16 * 256 * 512
    assert layer_norm.flops([[16, 256, 512], [], [], []], Context()) == 4 * 16 * 256 * 512


# -- the committed measurements ----------------------------------------------------------------


def test_resnet50_training_counts_its_convolutions_and_its_classifier(
    counted_store: MeasurementStore,
) -> None:
    found = flops.counted(counted_store)
    assert found.iterations == 5 and flops.uncounted_per_iteration(counted_store) == 0
    # per iteration: 53 convolutions forward and backward, 53 batch norms, the classifier's
    # addmm and its two backward mms
    per_iteration = {name: 0 for name in ("aten::convolution", "aten::convolution_backward")}
    for op in found.ops:
        per_iteration[op.name] = per_iteration.get(op.name, 0) + 1
    assert {k: v / 5 for k, v in per_iteration.items()} == {
        "aten::convolution": 53,
        "aten::convolution_backward": 53,
        "aten::batch_norm": 53,
        "aten::addmm": 1,
        "aten::mm": 2,
    }
    families = flops.per_iteration(counted_store, "family")
    assert families["matmul"] == 3 * 2 * 64 * 2048 * 1000  # 786,432,000: fc forward + backward
    # conv1: 2 x 112^2 output points x 7^2 x 3 in x 64 out x 64 images, forward, and twice
    # that backward (data and weight gradients)
    conv1 = 2 * 112 * 112 * 49 * 3 * 64 * 64
    assert conv1 == 15_105_785_856
    assert flops.per_iteration(counted_store, "layer")["conv1"] == 3 * conv1
    assert flops.total_per_iteration(counted_store) == pytest.approx(1573.803229184e9, abs=1)


def test_a_forward_convolution_takes_its_output_from_the_module_without_a_backward() -> None:
    store = MeasurementStore(INFERENCE)
    layers = flops.per_iteration(store, "layer")
    assert layers["conv1"] == 2 * 112 * 112 * 49 * 3 * 64  # batch 1: 236,027,904
    assert flops.uncounted_per_iteration(store) == 0
    # ResNet-50's 4.09 G multiply-adds per image, and its classifier
    assert flops.per_iteration(store, "family")["convolution"] == pytest.approx(8.174e9, rel=1e-3)


def test_gpt_counts_matmuls_and_attention_at_the_outermost_op(gpt: MeasurementStore) -> None:
    found = flops.counted(gpt)
    names = {op.name for op in found.ops}
    # aten::linear, aten::matmul and aten::scaled_dot_product_attention have no formula of
    # their own; the ops below them do, and the cuDNN attention under its sdpa op counts once
    assert "aten::_cudnn_attention_forward" not in names
    assert "aten::_scaled_dot_product_cudnn_attention" in names
    attention = 2 * (16 * 8) * 256 * 256 * 64
    forward, backward = 2 * attention, 5 * attention  # q k^T and p v; backward 2.5x
    assert flops.per_iteration(gpt, "family")["attention"] == 6 * (forward + backward)


def test_one_kernel_ops_give_it_all_their_flops_and_split_ops_keep_their_total(
    counted_store: MeasurementStore,
) -> None:
    rows = counters.kernel_info(counted_store).to_pylist()
    # layer1.0.conv1 forward: a 1x1 convolution, one CUTLASS kernel, 2 x 56^2 x 64 x 64 x 64
    (kernel,) = [r for r in rows if r["layer"] == "layer1.0.conv1" and r["phase"] == "forward"]
    assert kernel["algorithmic_gflop"] == pytest.approx(2 * 56 * 56 * 64 * 64 * 64 / 1e9)
    assert kernel["work_gflop"] == pytest.approx(1.6908288)
    assert kernel["executed_over_algorithmic"] == pytest.approx(1.6908288 / 1.644167168)
    assert kernel["tile_waste_pct"] == pytest.approx(2.838, abs=1e-3)
    # conv1 forward: two layout transposes, the implicit GEMM and a transpose back; their
    # shares (by executed FLOPs) add up to the op's
    conv1 = [r for r in rows if r["layer"] == "conv1" and r["phase"] == "forward"]
    assert len(conv1) == 4
    assert sum(r["algorithmic_gflop"] for r in conv1) == pytest.approx(15.105785856)
    # kernels of no counted op (a ReLU) have no math to compare with
    relu = next(r for r in rows if r["layer"] == "relu")
    assert relu["algorithmic_gflop"] == 0.0 and relu["executed_over_algorithmic"] is None


def test_layers_and_the_model_set_executed_against_algorithmic(
    counted_store: MeasurementStore,
) -> None:
    layers = {r["layer"]: r for r in counters.layer_metrics(counted_store).to_pylist()}
    # layer3's first 1x1 convolutions: 25.6% more executed than the math (whole tiles)
    assert layers["layer3.1.conv1"]["algorithmic_gflop"] == pytest.approx(3 * 6.576668672)
    assert layers["layer3.1.conv1"]["tile_waste_pct"] == pytest.approx(25.58, abs=0.01)
    # conv1's input needs no gradient: its backward computed less than the count's two products
    assert layers["conv1"]["executed_over_algorithmic"] == pytest.approx(0.9493, abs=1e-4)
    # a norm's FLOPs are an estimate: no ratio
    assert layers["bn1"]["algorithmic_gflop"] > 0 and layers["bn1"]["tile_waste_pct"] is None
    (model,) = counters.model_metrics(counted_store).to_pylist()
    exact = flops.total_per_iteration(counted_store, exact=True)
    assert exact == pytest.approx(1570.246754304e9, abs=1)
    assert model["executed_over_algorithmic"] == pytest.approx(1686.980841456e9 / exact)
    assert model["tile_waste_pct"] == pytest.approx(7.434, abs=1e-3)


def test_mfu_from_algorithmic_flops_and_the_untraced_step(counted_store: MeasurementStore) -> None:
    (row,) = utilization.model_flops(counted_store).to_pylist()
    assert row["step_ms"] == pytest.approx(36.038957, abs=1e-6)
    assert row["over_step_tflop_per_s"] == pytest.approx(1573.803229184 / 36.038957)
    assert row["roof"] == "tf32_tensor" and row["peak_source"] == "measured"
    assert row["mfu_pct"] == pytest.approx(
        100 * row["over_step_tflop_per_s"] / row["peak_tflop_per_s"]
    )
    assert row["mfu_pct"] == pytest.approx(10.54, abs=0.01)


def test_achieved_tflops_per_op_from_g_durations(gpt: MeasurementStore) -> None:
    ops = utilization.op_flops(gpt).to_pylist()
    head = next(r for r in ops if r["layer"] == "lm_head" and r["phase"] == "forward")
    assert head["input_shapes"] == "[[4096,512],[512,8192]]" and head["dtype"] == "c10::BFloat16"
    assert head["algorithmic_gflop_per_iteration"] == pytest.approx(2 * 4096 * 512 * 8192 / 1e9)
    assert head["kernels_per_iteration"] == 1
    assert head["achieved_tflop_per_s"] == pytest.approx(
        head["algorithmic_gflop_per_iteration"] / head["kernel_ms_per_iteration"]
    )
    assert head["roof"] == "bf16_tensor"
    assert head["of_peak_pct"] == pytest.approx(100 * head["achieved_tflop_per_s"] / 989.4)
    (model,) = utilization.model_flops(gpt).to_pylist()
    assert model["peak_source"] == "datasheet" and model["peak_tflop_per_s"] == 989.4


def test_shapes_from_another_run_still_give_layers_their_rates() -> None:
    store = MeasurementStore(GPT_SHAPES_IN_MF)
    assert flops.counted(store).run_index != flops.gpu_run(store)
    head = next(r for r in utilization.op_flops(store).to_pylist() if r["layer"] == "lm_head")
    assert head["kernel_ms_per_iteration"] is None  # its kernels are in another run
    layers = {r["layer"]: r for r in utilization.layer_flops(store).to_pylist()}
    assert layers["lm_head"]["algorithmic_gflop_per_iteration"] == pytest.approx(3 * 34.359738368)
    assert layers["lm_head"]["achieved_tflop_per_s"] is not None  # kernels joined by layer


def test_a_measurement_without_shapes_says_so_in_one_section() -> None:
    store = MeasurementStore(COUNTED / "M")
    keys = {s.key: s for s in sections(store)}
    assert not set(FLOP_KEYS) & set(keys)
    assert keys["flops"].absent and "op shapes" in keys["flops"].note


def test_the_catalog_lists_the_flop_analyses(counted_store: MeasurementStore) -> None:
    keys = {s.key: s for s in sections(counted_store)}
    assert set(FLOP_KEYS) <= set(keys)
    assert "24 MB still in the 50 MB L2" in keys["kernel_info"].note


def test_the_dram_write_note_matches_the_committed_calibration() -> None:
    cases = {c["case"]: c for c in json.loads(CALIBRATION.read_text())["cases"]}
    copy = cases["copy"]
    unwritten = copy["expected"]["bytes_written"] - copy["counted"]["dram_write_bytes"]
    assert unwritten == 24_049_920  # 24 MB left in the L2
    assert copy["dram_read_ratio"] == pytest.approx(1.0000, abs=1e-4)
    assert copy["dram_write_ratio"] == pytest.approx(0.9888, abs=1e-4)
    assert "0.9888x" in counters.DRAM_WRITE_NOTE and "1.0000x" in counters.DRAM_WRITE_NOTE
