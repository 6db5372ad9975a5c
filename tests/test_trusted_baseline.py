"""A baseline to trust: M over several processes with its interval, untraced iterations between
the traced ones in the process that prices F, and the replay checked both ways (issue 48).

The measurements in ``benchmarks/data/trusted-h100`` were recorded on a lent H100 by
``bash benchmarks/device.sh trusted`` (``benchmarks/trusted_baseline.py``): M,MF,MFLG with M in
three processes and 20 interleaved pairs in the MF process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay import replay
from xsp.analysis.replay.m_interval import interval, m_interval, process_steps
from xsp.analysis.tables.summary import level_sets
from xsp.core.levelset import LevelSet
from xsp.core.store import open_run
from xsp.tracer.capture import interleave
from xsp.tracer.capture.session import Session
from xsp.tracer.run.runner import LeveledSpec, run_leveled
from xsp.tracer.spec import ProfileSpec, RunSpec

ROOT = Path(__file__).resolve().parents[1]
TRUSTED = ROOT / "benchmarks" / "data" / "trusted-h100"


def test_the_interval_of_two_processes_is_as_worked_out_by_hand() -> None:
    """Two processes of three steps each, 1 ms and 3 ms: the pooled median is 2 ms. A resample
    draws two processes with replacement (1 and 1, 1 and 3, 3 and 1, 3 and 3: medians 1, 2, 2
    and 3 ms, with chances 1/4, 1/2, 1/4), so the 2.5th and 97.5th percentiles are 1 and 3 ms:
    the interval is as wide as the processes disagree, however steady each one is."""
    found = interval([np.array([1.0, 1.0, 1.0]), np.array([3.0, 3.0, 3.0])])
    assert (found.median_ms, found.low_ms, found.high_ms) == (2.0, 1.0, 3.0)
    assert found.process_medians_ms == (1.0, 3.0) and found.iterations == 6
    assert not found.single
    assert [found.position(ms) for ms in (0.5, 2.0, 3.5)] == ["below", "inside", "above"]


def test_one_process_gives_the_spread_of_its_iterations_alone() -> None:
    """One process of 2, 2 and 4 ms: a resample's median is 4 ms when it draws two 4s or three
    (3 x (1/3)^2 x 2/3 + (1/3)^3 = 7/27 of the time), else 2 ms: the interval is 2-4 ms, and it
    says nothing of other processes (``single``)."""
    found = interval([np.array([2.0, 2.0, 4.0])])
    assert (found.median_ms, found.low_ms, found.high_ms) == (2.0, 2.0, 4.0)
    assert found.single


@pytest.mark.parametrize(
    ("levels", "device", "says"),
    [
        ("MF", "cuda", None),
        ("MFL", "cpu", None),  # oneDNN's verbose switch, between iterations
        ("MFL", "cuda", "records L through CUPTI"),
        ("MFLG", "cuda", "records G, which cannot be switched off"),
        ("M", "cpu", "has no level F"),
    ],
)
def test_only_levels_that_switch_off_cheaply_interleave(
    levels: str, device: str, says: str | None
) -> None:
    reason = interleave.unavailable(LevelSet(levels), device, continuous=False)
    assert reason is None if says is None else says in reason


def test_a_session_runs_an_untraced_iteration_before_each_traced_one(tmp_path: Path) -> None:
    """MF, 3 measured iterations after 1 warm-up: the loop runs 1 + 3 untraced + 3 traced = 7
    times. The store holds the 3 traced steps, each with the model's 4 module calls (the
    Sequential and its 3 layers); the untraced ones are in run.json alone, 3 pairs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(2, 8)
    profile = ProfileSpec(iterations=3, warmup=1, device="cpu", interleave=True)
    session = Session.from_spec(RunSpec(LevelSet("MF"), profile, out=str(tmp_path / "MF")))
    loops = 0
    with session:
        while not session.done:
            with session.iteration():
                model(x)
            loops += 1
    assert loops == 7
    run = open_run(tmp_path / "MF")
    paired = run.meta[interleave.RUN_KEY]
    assert paired["pairs"] == 3
    assert len(paired["untraced_ms"]) == len(paired["traced_ms"]) == 3
    assert all(ms > 0 for ms in paired["untraced_ms"] + paired["traced_ms"])
    rows = run.spans().to_pylist()
    assert sorted(r["iteration"] for r in rows if r["kind"] == "step") == [0, 1, 2]
    assert sum(1 for r in rows if r["kind"] == "module") == 3 * 4
    assert run.meta["status"] == "ok" and run.meta["host"]["measured"]["cpus_allowed"] >= 1


def test_a_level_set_that_cannot_interleave_says_why_in_run_json(tmp_path: Path) -> None:
    profile = ProfileSpec(iterations=1, warmup=0, device="cpu", interleave=True)
    session = Session.from_spec(RunSpec(LevelSet("M"), profile, out=str(tmp_path / "M")))
    with session, session.iteration():
        pass
    said = open_run(tmp_path / "M").meta[interleave.RUN_KEY]
    assert said == {"skipped": "level set M has no level F to switch off"}


def test_m_runs_in_three_processes_and_the_summary_places_mf_against_its_interval(
    tmp_path: Path,
) -> None:
    """SqueezeNet b1 inference on the CPU at M,MF with M in three processes: the measurement's
    own (which MF shares) and two more after it, each in ``m-processes/<n>``; M's row is all
    three processes' steps, and MF's verdict is its median against M's interval."""
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=3, warmup=1, device="cpu", model="torchvision:squeezenet1_1"
        ),
        level_sets=("M", "MF"),
        fork_server=True,
        share_process=True,
        m_processes=3,
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    manifest = json.loads((spec.out / "manifest.json").read_text())
    listed = manifest["m_processes"]
    assert [(e["process"], e["path"], e["status"]) for e in listed] == [
        (2, "m-processes/2", "ok"),
        (3, "m-processes/3", "ok"),
    ]
    store = MeasurementStore(spec.out)
    groups = process_steps(store)
    assert len(groups) == 3
    found = m_interval(store)
    assert found is not None and found.processes == 3
    assert found.median_ms == pytest.approx(float(np.median(np.concatenate(groups))))
    rows = {r["levels"]: r for r in level_sets(store).to_pylist()}
    assert rows["M"]["iterations"] == sum(len(g) for g in groups)
    assert rows["M"]["step_median_ms"] == pytest.approx(found.median_ms)
    mf = rows["MF"]["step_median_ms"]
    expected = {"inside": "noise", "above": "added", "below": "below M"}[found.position(mf)]
    assert rows["MF"]["overhead_verdict"] == expected
    assert store.runs[1].meta[interleave.RUN_KEY]["pairs"] == 3  # MF, in M's process


def test_the_amp_accumulation_script_is_checked_in_its_own_process() -> None:
    """The mixed-precision script with a GradScaler, two micro-batches of accumulation and
    checkpointing (benchmarks/workloads/amp_accum_train.py): the issue's script that replayed
    +25% off M with no check. Its M processes ran at 51.4, 77.8 and 62.2 ms (each the median of
    its steady steps), so the replay's +17.1% against their pooled 59.75 ms says little: it lies
    inside M's interval, 50.64-77.80 ms. Against the MF process's own untraced iterations, each
    pair's traced one replayed with F's cost fitted to the other fold, it is +2.1% (70.07 ms
    untraced, 71.54 ms replayed over 18 steady pairs of 20), with a 95% interval of -11.2% to
    +21.3% from the host's own spread between iterations (two untraced steps took 140 and 148
    ms, where the scaler skipped an optimizer step and the iteration held two)."""
    store = MeasurementStore(TRUSTED / "amp-accum")
    found = replay(store).summary()
    assert found["checked"] is True and found["unchecked"] == []
    own = found["in_process"]
    assert own["pairs"] == 20 and len(own["checked_iterations"]) == 18
    assert (own["untraced_ms"], own["replayed_ms"]) == pytest.approx((70.0685, 71.5405), abs=1e-3)
    assert own["error_pct"] == pytest.approx(2.10, abs=0.01)
    assert (own["error_low_pct"], own["error_high_pct"]) == pytest.approx((-11.2, 21.3), abs=0.1)
    each = [
        float(np.median(g))
        for g in process_steps(store)  # the M run's and the two further processes' steps
    ]
    assert each == pytest.approx([51.386, 77.799, 62.214], abs=1e-3)
    across = found["m_interval"]
    assert across["process_medians_ms"] == pytest.approx(each)
    assert (across["low_ms"], across["high_ms"]) == pytest.approx((50.643, 77.799), abs=1e-3)
    assert across["position"] == "inside" and found["error_pct"] == pytest.approx(17.05, abs=0.01)
    paired = json.loads((TRUSTED / "amp-accum" / "MF" / "run.json").read_text())["interleaved"]
    assert sorted(paired["untraced_ms"])[-2:] == pytest.approx([140.8324, 148.438])


def test_batch_1_inference_replays_within_2_percent_of_its_own_untraced_steps() -> None:
    """ResNet-50 b1 inference as a script (benchmarks/workloads/b1_infer.py), host-bound: M's
    processes ran at 5.18, 3.63 and 3.25 ms, a 1.6x spread; the replay is -0.36% off the MF
    process's own untraced 3.476 ms, and inside M's interval."""
    found = replay(MeasurementStore(TRUSTED / "b1-infer")).summary()
    own, across = found["in_process"], found["m_interval"]
    assert own["error_pct"] == pytest.approx(-0.36, abs=0.01) and own["holds"] is True
    assert across["process_medians_ms"] == pytest.approx([5.182, 3.631, 3.247], abs=1e-3)
    assert across["position"] == "inside"


def test_a_gpu_bound_step_keeps_its_replay_and_bn1_leads() -> None:
    """ResNet-50 b64 training on the H100: the three M processes agree within 0.2 ms, so M's
    interval is narrow (37.57-37.79 ms) and the replayed 38.00 ms (+1.04%) lies just above it;
    the in-process check is +0.60%. bn1 still leads the layers by GPU time."""
    from xsp.analysis.replay import critical_path

    store = MeasurementStore(TRUSTED / "r50-b64-train")
    found = replay(store).summary()
    assert found["error_pct"] == pytest.approx(1.04, abs=0.01)
    assert found["in_process"]["error_pct"] == pytest.approx(0.60, abs=0.01)
    assert found["m_interval"]["position"] == "above"
    assert found["checks"]["activities_before_launch"] == 0
    assert critical_path.layers(store, 1).column("layer")[0].as_py() == "bn1"
    assert critical_path.verdict(store).startswith("GPU-bound: 95% gpu compute (62-98% across")


@pytest.mark.parametrize("value", ["0", "many", "65"])
def test_a_bad_m_process_count_is_one_line(value: str, tmp_path: Path) -> None:
    from xsp.core import config
    from xsp.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bad XSP_M_PROCESSES='.+': give 1 to 64"):
        config.m_processes({"XSP_M_PROCESSES": value})
    assert config.m_processes({}) == 3
    with pytest.raises(ConfigError, match="bad --m-processes 0: must be at least 1"):
        LeveledSpec(out=tmp_path, m_processes=0)


def test_a_layers_share_gives_its_range_across_iterations() -> None:
    """The known-duration workload's layer 2 (a 2 ms kernel) holds 34.97% of the replayed step
    on the median, 34.53-35.15% from one steady iteration to the next: worked out here from the
    replayed spans, each iteration's kernels of layer 2 against its replayed step."""
    from xsp.analysis.replay import critical_path
    from xsp.analysis.replay.critical_path import _steady_iterations

    store = MeasurementStore(ROOT / "benchmarks" / "data" / "replay-h200" / "known-layers")
    row = critical_path.layers(store, 1).to_pylist()[0]
    assert row["layer"] == "2"
    result = replay(store)
    spans = result.spans
    kept = set(_steady_iterations(result).tolist())
    iteration = spans.column("iteration").to_pylist()
    level = spans.column("level").to_pylist()
    kind = spans.column("kind").to_pylist()
    layer = spans.column("module_path").to_pylist()
    gpu: dict[int, int] = {}
    step: dict[int, int] = {}
    for at, it in enumerate(iteration):
        if it not in kept:
            continue
        if kind[at] == "step":
            step[it] = int(result.dur_ns[at])
        elif level[at] == "gpu" and layer[at] == "2":
            gpu[it] = gpu.get(it, 0) + int(result.dur_ns[at])
    shares = [100.0 * gpu.get(it, 0) / step[it] for it in step]
    assert (row["share_min_pct"], row["share_max_pct"]) == pytest.approx((min(shares), max(shares)))
    assert (row["share_min_pct"], row["share_max_pct"]) == pytest.approx((34.53, 35.15), abs=0.01)
    assert row["share_min_pct"] <= row["share_pct"] <= row["share_max_pct"]
