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
from xsp.analysis.replay import fitted_graph, replay, replay_with, what_if
from xsp.core.columns import numbers
from xsp.core.store.op_timings import CaseTiming, OpTimings, read_timings, write_timings

ROOT = Path(__file__).resolve().parents[1]
#: ResNet-18 b2 inference on the CPU at M,MF (3 iterations; op shapes recorded).
RESNET18_CPU = ROOT / "tests" / "data" / "resnet18_drifted_mf_cpu"
#: ResNet-50 b64 training on the H200 at M,MF,MFLG (20 iterations).
RESNET50_GPU = ROOT / "benchmarks" / "data" / "replay-h200" / "r50-b64-train"
#: ResNet-50 b1 inference on the H200 at M,MF,MFLG (20 iterations): host-bound.
RESNET50_B1_GPU = ROOT / "benchmarks" / "data" / "replay-h200" / "r50-b1-infer"


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
    rows of the host time each loses on the replay's timeline (ms): (1 - host factor) x its
    duration, or its cut, no more than its duration."""
    found = affected(store, timings.fix)
    row = row_factors(store, found, timings)
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
        mine = iteration == i
        lost = duration[mine] * (1.0 - row.host[mine])
        lost += np.clip(row.host_cut_ns[mine], None, duration[mine])
        replayed.append(float(before - after))
        summed.append(float(lost.sum() / 1e6))
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
    factors = row_factors(store, found, timings).host
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
    both = row_factors(store, found, cut)
    assert (both.host == 1.0).all() and (both.host_cut_ns == 0.0).all()  # no host times
    factors = both.activities
    graph = fitted_graph(store)
    names = np.asarray(graph.deep.column("name").to_pylist(), dtype=object)
    scaled = factors != 1.0
    assert sorted(set(factors[scaled].tolist())) == [0.25, 0.5]
    assert graph.gpu[scaled].all()  # kernels only, no host span
    transposes = np.array(["nchwToNhwc" in n or "nhwcToNchw" in n for n in names])
    assert (transposes & graph.gpu & ~scaled).sum() == 0  # all within the touched ops
    step = replay(store).result().step_ms
    assert step is not None
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
        method="paired processes",
        status="measured",
        evidence="R/verify/layout-transposes",
    )
    isolated = summary_line(RuleResult(row, "channels_last", "", "", "measured in isolation: x"))
    assert isolated.endswith(f"outside the measured interval: {ISOLATION_NOTE}")
    modelled = summary_line(RuleResult(row, "channels_last", "", "", "modelled: replay ..."))
    note = RULES_BY_NAME["layout-transposes"].estimate_note
    assert note is not None and modelled.endswith(note)


def test_a_verified_line_whose_interval_holds_no_gain_says_so() -> None:
    """TF32 on BERT b1 inference (H100, estimate_accuracy run 5): verify's 2 rounds measured
    -0.20 ms (-0.85–0.29) where the fix gained 0.17 ms alternating inside one process. The
    line says the gain is below the drift between processes, rather than calling the 0.15 ms
    estimate wrong."""
    from xsp.campaign.verify import UNRESOLVED_NOTE, Row, RuleResult, summary_line

    def line(low: float, high: float) -> str:
        row = Row(
            rule="fp32-on-tensor-cores",
            predicted_gain_ms_per_iteration=0.152,
            measured_gain_ms_per_iteration=(low + high) / 2,
            measured_gain_ci_ms=[low, high],
            measured_gain_pct=-4.1,
            numerics_change=True,
            rounds=2,
            method="paired processes",
            status="measured",
            evidence="R/verify/fp32-on-tensor-cores",
        )
        return summary_line(RuleResult(row, "tf32", "", "", "measured in isolation: x"))

    assert line(-0.85, 0.29).endswith(f"; {UNRESOLVED_NOTE}")
    assert "outside the measured interval" not in line(-0.85, 0.29)
    assert UNRESOLVED_NOTE not in line(0.30, 0.40)  # a gain, the estimate outside it
    assert "outside the measured interval" in line(0.30, 0.40)


def test_on_a_host_bound_gpu_step_the_host_saving_moves_it_and_the_kernels_do_not() -> None:
    """ResNet-50 b1 inference on the H200 is host-bound (its critical path: host work and
    launches). TF32 touches its 53 fp32 convolutions and its classifier's GEMM: 24 shapes,
    54 ops a step, 1,080 in 20 iterations. Timed with the host's side saving 5 of its 10 µs a
    call and the kernels unchanged, each op's own host span loses 5 µs at its end (its kernels
    and launches keep their durations), and each replayed step moves by exactly the touched
    ops' 54 x 5 µs; kernels at half and the host unchanged (what scaling kernels alone gave
    BERT b1) move it by nothing; both move it as the host alone; no change moves nothing."""
    store = MeasurementStore(RESNET50_B1_GPU)
    found = affected(store, "tf32")
    assert (len(found.cases), sum(c.per_iteration for c in found.cases)) == (24, 54)
    assert ((found.forward_case >= 0).sum(), (found.backward_case >= 0).sum()) == (1080, 0)

    def timed(gpu: float, host: float) -> OpTimings:
        rows = [
            CaseTiming(c.key, 100.0, 100.0 * gpu, base_host_us=10.0, fixed_host_us=10.0 * host)
            for c in found.cases
        ]
        return OpTimings("tf32", "cuda:0", "test", found.cases, rows)

    host_half = timed(1.0, 0.5)
    factors = row_factors(store, found, host_half)
    graph = fitted_graph(store)
    cut = factors.host_cut_ns != 0.0
    assert cut.sum() == 1080 and (found.forward_case[cut] >= 0).all()
    assert set(factors.host_cut_ns[cut].tolist()) == {5000.0} and not graph.gpu[cut].any()
    assert (factors.activities == 1.0).all() and (factors.host == 1.0).all()
    duration = graph.warped_end - graph.warped_start
    assert (duration[cut] > 5000).all()  # each span longer than its cut: 54 x 5 µs a step
    replayed, summed = _step_deltas(store, host_half)
    assert len(replayed) == 20
    assert summed == pytest.approx([0.27] * 20, abs=1e-9)
    assert replayed == pytest.approx(summed, abs=1e-4)
    step = replay(store).result().step_ms
    assert step is not None

    def gain(gpu: float, host: float) -> float:
        edited = what_if(store, isolation_edit(store, found, timed(gpu, host)))
        assert edited is not None
        return float(step - edited)

    steps = numbers(replay(store).steps.column("replayed_ms"))
    host_gain = float(np.median(steps) - np.median(steps - np.asarray(replayed)))
    # the median step moves by no less than the least of the steps' cuts, no more than the most
    assert 0 < min(summed) - 1e-9 <= host_gain <= max(summed) + 1e-9
    assert gain(1.0, 0.5) == pytest.approx(host_gain, abs=1e-9)
    assert gain(0.5, 1.0) == 0.0
    assert gain(0.5, 0.5) == pytest.approx(host_gain, abs=1e-9)
    assert gain(1.0, 1.0) == 0.0
    estimate_model = isolation_edit(store, found, host_half).model
    assert "its host span cut by the host time saved a call" in estimate_model


def test_op_timings_from_before_host_times_still_read(tmp_path: Path) -> None:
    """A file written before the host times and kernel counts were measured reads with them
    None, and its replay scales kernels only."""
    found = affected(MeasurementStore(RESNET50_B1_GPU), "tf32")
    timing = CaseTiming(found.cases[0].key, 20.0, 10.0, base_host_us=8.0, fixed_host_us=6.0)
    write_timings(tmp_path, OpTimings("tf32", "cuda:0", "test", found.cases[:1], [timing]))
    path = tmp_path / "estimates" / "tf32.json"
    data = json.loads(path.read_text())
    assert data["timings"][0]["base_host_us"] == 8.0
    for name in ("base_host_us", "fixed_host_us", "base_kernels", "fixed_backward_kernels"):
        del data["timings"][0][name]
    path.write_text(json.dumps(data))
    timings = read_timings(tmp_path, "tf32")
    assert timings is not None
    (old,) = timings.timings
    assert (old.base_forward_us, old.fixed_forward_us) == (20.0, 10.0)
    assert (old.base_host_us, old.fixed_host_us, old.base_kernels) == (None, None, None)


def test_a_replaced_measurement_takes_the_earlier_ones_timings_with_it(tmp_path: Path) -> None:
    """`xsp run --replace` into a measurement `xsp estimate` had timed: the timings were taken
    for the earlier measurement's ops, and left behind they turned the new one's "modelled"
    estimates into "measured in isolation" (estimate_accuracy's run 6 printed run 5's
    isolation figures as modelled). They go with the measurement; the user's files stay."""
    from xsp.tracer.run.earlier import earlier_parts, refuse_or_remove

    run = tmp_path / "r18"
    shutil.copytree(RESNET18_CPU, run)
    (run / "notes.txt").write_text("mine")
    found = affected(MeasurementStore(run), "channels_last")
    timings = [CaseTiming(c.key, 100.0, 50.0) for c in found.cases]
    write_timings(run, OpTimings("channels_last", "cpu", "test", found.cases, timings))
    assert isolation_estimate(MeasurementStore(run), "channels_last") is not None
    assert run / "estimates" in earlier_parts(run)
    refuse_or_remove(run, replace=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
