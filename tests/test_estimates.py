"""Estimates from ops timed in isolation (``xsp estimate``): which ops a fix touches, their shapes
rebuilt, real timings on this CPU, and the step replayed with each op's ratio. Speed is not
asserted (the timings are this machine's); the mechanism is: each touched op and backward node
keeps its timed ratio of its recorded time, and the replayed step moves by exactly their sum."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xsp.analysis.estimates import affected, isolation_edit, isolation_estimate, row_factors
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay import fitted_graph, replay, replay_with
from xsp.core.columns import numbers
from xsp.core.store.op_timings import CaseTiming, OpTimings, read_timings, write_timings

ROOT = Path(__file__).resolve().parents[1]
#: ResNet-18 b2 inference on the CPU at M,MF (3 iterations; op shapes recorded).
RESNET18_CPU = ROOT / "tests" / "data" / "resnet18_drifted_mf_cpu"
#: ResNet-50 b64 training on the H200 at M,MF,MFLG (20 iterations).
RESNET50_GPU = ROOT / "benchmarks" / "data" / "replay-h200" / "r50-b64-train"


CHANNELS_LAST_1MS = ("--fix", "channels_last", "--budget-ms", "1")


def test_the_ops_channels_last_touches_in_resnet18_and_their_convolutions_rebuilt() -> None:
    """ResNet-18 has 20 convolutions and 20 batch norms a step; 16 distinct shapes. Strides
    come from each module call's output: the stem's 7x7 (224 -> 112: stride 2, padding 3),
    layer2-4's first 3x3 and their 1x1 downsamples (stride 2): 7 strided ops a step. The stem's
    input is the batch, whose gradient no step needs."""
    found = affected(MeasurementStore(RESNET18_CPU), "channels_last")
    assert len(found.cases) == 16
    assert sum(c.per_iteration for c in found.cases) == 40
    convs = [c for c in found.cases if c.op == "aten::convolution"]
    assert sum(c.per_iteration for c in convs) == 20
    assert sum(c.per_iteration for c in convs if c.stride == [2, 2]) == 7
    stem = next(c for c in convs if c.shapes[0] == [2, 3, 224, 224])
    assert (stem.stride, stem.padding, stem.groups) == ([2, 2], [3, 3], 1)
    assert not stem.input_grad and not stem.backward
    downsample = next(c for c in convs if c.shapes[1] == [128, 64, 1, 1])
    assert (downsample.stride, downsample.padding) == ([2, 2], [0, 0])
    assert (found.forward_case >= 0).sum() == 3 * 40  # 3 iterations, each op once
    assert (found.backward_case >= 0).sum() == 0  # inference: no autograd node
    # TF32 (and bf16) change the fp32 convolutions and the classifier's GEMM
    tf32 = affected(MeasurementStore(RESNET18_CPU), "tf32")
    assert sum(c.per_iteration for c in tf32.cases) == 21
    assert [c.shapes for c in tf32.cases if c.op == "aten::addmm"] == [
        [[1000], [2, 512], [512, 1000], [], []]  # beta and alpha: scalars
    ]


def _step_deltas(store: MeasurementStore, timings: OpTimings) -> tuple[list[float], list[float]]:
    """Per iteration: the replayed step less the edited replay's, and the sum over the touched
    rows of (1 - factor) x their host duration on the replay's timeline (ms)."""
    found = affected(store, timings.fix)
    factors = row_factors(store, found, timings)
    graph = fitted_graph(store)
    base = replay(store).steps
    edited = replay_with(store, isolation_edit(store, found, timings)).steps
    duration = (graph.warped_end - graph.warped_start).astype(np.float64)
    iteration = numbers(graph.deep.column("iteration"), null=-1)
    replayed, summed = [], []
    for i, before, after in zip(
        numbers(base.column("iteration")),
        numbers(base.column("replayed_ms")),
        numbers(edited.column("replayed_ms")),
        strict=True,
    ):
        rows = (factors != 1.0) & (iteration == i)
        replayed.append(float(before - after))
        summed.append(float((duration[rows] * (1.0 - factors[rows])).sum() / 1e6))
    return replayed, summed


def test_ratios_that_cut_and_grow_host_time_move_the_step_by_their_sum(tmp_path: Path) -> None:
    """On a CPU measurement the touched ops run on the host: a convolution timed 2x slower
    with the fix grows by its own duration, a batch norm timed 2x faster loses half of it, and
    each replayed step moves by exactly the sum (to the replay's 1 ns rounding per span)."""
    store = MeasurementStore(RESNET18_CPU)
    found = affected(store, "channels_last")
    timings = OpTimings(
        "channels_last",
        "cpu",
        "test",
        found.cases,
        [
            CaseTiming(c.key, 100.0, 200.0 if c.op == "aten::convolution" else 50.0)
            for c in found.cases
        ],
    )
    factors = row_factors(store, found, timings)
    assert sorted(set(factors[found.forward_case >= 0].tolist())) == [0.5, 2.0]
    assert (factors[found.forward_case < 0] == 1.0).all()
    replayed, summed = _step_deltas(store, timings)
    assert len(replayed) == 3
    assert replayed == pytest.approx(summed, abs=1e-4)
    assert all(delta < 0 for delta in replayed)  # the convolutions outweigh the norms


def test_xsp_estimate_times_real_ops_on_the_cpu_and_the_replay_applies_them(
    tmp_path: Path,
) -> None:
    """`xsp estimate RUN --fix channels_last` on the CPU: every one of the 16 cases timed
    without and with channels_last (real oneDNN calls), the file written into the measurement,
    and the estimate it gives is the replay with those ratios: per iteration the step moves by
    the sum of the touched ops' changes, and the gain is the median step's."""
    run = tmp_path / "r18"
    shutil.copytree(RESNET18_CPU, run)
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "estimate", str(run), *CHANNELS_LAST_1MS, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(done.stdout)["fixes"]
    assert (result["fix"], result["cases"], result["ops_per_iteration"]) == (
        "channels_last",
        16,
        40.0,
    )
    timings = read_timings(run, "channels_last")
    assert timings is not None and len(timings.timings) == 16
    assert all(t.base_forward_us > 0 and t.fixed_forward_us > 0 for t in timings.timings)
    assert all(t.base_backward_us is None for t in timings.timings)  # inference
    store = MeasurementStore(run)
    replayed, summed = _step_deltas(store, timings)
    assert replayed == pytest.approx(summed, abs=1e-4)
    estimate = isolation_estimate(store, "channels_last")
    assert estimate is not None and estimate.missing == 0
    steps = numbers(replay(store).steps.column("replayed_ms"))
    edited = steps - np.asarray(replayed)
    assert estimate.gain_ms == pytest.approx(float(np.median(steps) - np.median(edited)))
    assert result["gain_ms_per_iteration"] == pytest.approx(estimate.gain_ms)
    assert estimate.model.startswith("measured in isolation: each op channels_last changes")


def test_on_a_gpu_measurement_the_ratios_scale_the_ops_kernels(tmp_path: Path) -> None:
    """ResNet-50 b64 training: 53 convolutions and 53 batch norms a step (35 shapes), each with
    its autograd node (20 iterations: 2,120 of each). With every forward timed at half its time
    and every backward at a quarter, the forward ops' kernels keep half their durations and
    the backward nodes' a quarter (cuDNN's transposes all among them), no host span changes,
    and the replayed step gains at most the kernels' cut; all ratios 1 gain nothing."""
    store = MeasurementStore(RESNET50_GPU)
    found = affected(store, "channels_last")
    assert (len(found.cases), sum(c.per_iteration for c in found.cases)) == (35, 106)
    assert ((found.forward_case >= 0).sum(), (found.backward_case >= 0).sum()) == (2120, 2120)
    assert all(c.backward and c.training for c in found.cases)
    assert sum(c.per_iteration for c in found.cases if not c.input_grad) == 1  # the stem

    def timed(forward: float, backward: float) -> OpTimings:
        rows = [
            CaseTiming(c.key, 100.0, 100.0 * forward, 100.0, 100.0 * backward) for c in found.cases
        ]
        return OpTimings("channels_last", "cuda:0", "test", found.cases, rows)

    cut = timed(0.5, 0.25)
    factors = row_factors(store, found, cut)
    graph = fitted_graph(store)
    names = np.asarray(graph.deep.column("name").to_pylist(), dtype=object)
    scaled = factors != 1.0
    assert sorted(set(factors[scaled].tolist())) == [0.25, 0.5]
    assert graph.gpu[scaled].all()  # kernels only, no host span
    transposes = np.array(["nchwToNhwc" in n or "nhwcToNchw" in n for n in names])
    assert (transposes & graph.gpu & ~scaled).sum() == 0  # all within the touched ops
    step = replay(store).result().step_ms
    assert step is not None
    from xsp.analysis.replay import what_if

    edited = what_if(store, isolation_edit(store, found, cut))
    assert edited is not None
    iterations = len(set(numbers(graph.deep.column("iteration"))[scaled].tolist()))
    most = float((graph.dur[scaled] * (1.0 - factors[scaled])).sum()) / iterations / 1e6
    assert 0 < step - edited <= most
    same = what_if(store, isolation_edit(store, found, timed(1.0, 1.0)))
    assert same == pytest.approx(step, abs=1e-9)


def test_a_suggestion_says_measured_in_isolation_once_the_ops_were_timed(
    tmp_path: Path,
) -> None:
    """layout-transposes on ResNet-50: modelled (the transposes dropped) until the timings
    exist, then the replay of the timed ratios, worded so, in the same open store."""
    from xsp.analysis.suggestions.rules import CHANNELS_LAST, suggest

    run = tmp_path / "r50"
    shutil.copytree(RESNET50_GPU, run)
    store = MeasurementStore(run)
    (before,) = suggest(store).to_pylist()
    assert before["estimate"] == CHANNELS_LAST.model
    assert before["estimate"].startswith("modelled: ")
    found = affected(store, "channels_last")
    rows = [CaseTiming(c.key, 100.0, 40.0, 100.0, 60.0) for c in found.cases]
    write_timings(run, OpTimings("channels_last", "cuda:0", "test", found.cases, rows))
    (after,) = suggest(store).to_pylist()  # the same store: what it kept names the file's version
    estimate = isolation_estimate(store, "channels_last")
    assert estimate is not None
    assert after["gain_ms_per_iteration"] == pytest.approx(estimate.gain_ms)
    assert after["estimate"].startswith("measured in isolation")
    assert after["estimate"].endswith("(106 ops a step, 35 shapes)")


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    """A fix that changes no op, and a GPU measurement on a host without a GPU."""
    for argv, said in (
        (["--fix", "cuda_graphs"], "xsp: error: fix 'cuda_graphs' changes no op"),
        (["--fix", "channels_last"], "no CUDA GPU is visible here"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "xsp", "estimate", str(RESNET50_GPU), *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""},
        )
        assert done.returncode == 2
        assert said in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_verified_line_outside_the_interval_says_why_an_isolated_timing_can_miss() -> None:
    """The terminal line's closing note follows the estimate's model: the rule's own note for
    a modelled estimate, the isolation note for ops timed alone."""
    from xsp.analysis.suggestions.rules import RULES_BY_NAME
    from xsp.campaign.verify import ISOLATION_NOTE, Row, RuleResult, summary_line

    row = Row(
        rule="layout-transposes",
        predicted_gain_ms_per_iteration=4.0,
        measured_gain_ms_per_iteration=7.37,
        measured_gain_ci_ms=[6.0, 8.57],
        measured_gain_pct=21.9,
        numerics_change=False,
        rounds=2,
        status="measured",
        evidence="R/verify/layout-transposes",
    )
    isolated = summary_line(RuleResult(row, "channels_last", "", "", "measured in isolation: x"))
    assert isolated.endswith(f"outside the measured interval: {ISOLATION_NOTE}")
    modelled = summary_line(RuleResult(row, "channels_last", "", "", "modelled: replay ..."))
    note = RULES_BY_NAME["layout-transposes"].estimate_note
    assert note is not None and modelled.endswith(note)
