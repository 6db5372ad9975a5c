"""``xsp verify --in-process``: a fix's two sides timed in alternating blocks inside each
process (``xsp.tracer.workloads.alternating``), on the CPU."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from xsp.campaign import verify as verifying
from xsp.campaign.in_process import RECORD_FILE
from xsp.campaign.paired import paired_gain
from xsp.core.errors import ConfigError
from xsp.tracer.spec import ProfileSpec
from xsp.tracer.workloads.alternating import BASE, FIXED, Side, alternate, measure_zoo, refusal
from xsp.tracer.workloads.fixes import Switches

BASE_MS, FIXED_MS = 6.0, 3.0
#: The process slows down by this much at every step, whichever side runs it.
DRIFT_MS = 0.05


def test_alternating_blocks_cancel_a_drift_larger_than_the_gain() -> None:
    """A 3 ms gain under a drift that adds 0.05 ms a step: over 2 x 6 blocks of 5 steps (plus 2
    warm-up steps a side) the process slows by 3.2 ms, more than the gain. Timed one side after
    the other, the fixed side would carry 1.6 ms more drift (32 steps later on average) and the
    gain would read about 1.4 ms. In blocks whose first side alternates, a linear drift weighs on
    both sides alike (over each two pairs of blocks, both sides' steps have the same mean
    position), and the gain reads 3 ms."""
    calls = 0

    def sleeper(ms: float) -> Side:
        def step() -> None:
            nonlocal calls
            time.sleep((ms + DRIFT_MS * calls) / 1e3)
            calls += 1

        return Side(step)

    done = alternate({BASE: sleeper(BASE_MS), FIXED: sleeper(FIXED_MS)}, 6, 5, 2)
    assert done.block_order == [BASE, FIXED, FIXED, BASE] * 3
    assert [len(done.steps_ms[side]) for side in (BASE, FIXED)] == [30, 30]
    gain = paired_gain([done.steps_ms[BASE]], [done.steps_ms[FIXED]]).gain_ms
    # sleeping overshoots alike on both sides; a loaded host adds to both
    assert BASE_MS - FIXED_MS - 0.6 < gain < BASE_MS - FIXED_MS + 0.6, gain


def test_each_block_runs_under_its_sides_switches() -> None:
    """Every block of a side (and its warm-up) runs inside its ``running``, which puts the state
    back after: each step sees its own side's state, never the other's left behind."""
    state = {"on": False}
    seen: dict[str, list[bool]] = {BASE: [], FIXED: []}

    @contextlib.contextmanager
    def on() -> Iterator[None]:
        state["on"] = True
        try:
            yield
        finally:
            state["on"] = False

    record = {name: partial(lambda n: seen[n].append(state["on"]), name) for name in seen}
    alternate({BASE: Side(record[BASE]), FIXED: Side(record[FIXED], on)}, 4, 3, 1)
    assert seen[BASE] == [False] * 13 and seen[FIXED] == [True] * 13
    assert state["on"] is False


def test_only_a_fix_that_can_be_undone_runs_in_one_process() -> None:
    assert refusal("channels_last") is None and refusal("tf32") is None
    assert refusal("bf16") is None and refusal("compile") is None
    # cuDNN caches the algorithm it picked, with or without its autotuner, for the process
    for fix in ("cudnn_benchmark", "dataloader", "alloc_conf"):
        assert refusal(fix) == (
            f"the {fix} fix changes the process before it starts, so it cannot be switched off"
        )
    with pytest.raises(ConfigError, match="dataloader fix changes the process"):
        measure_zoo("torchvision:resnet18", 1, "infer", "cpu", "dataloader")


def test_a_switch_fix_leaves_the_process_as_it_found_it() -> None:
    """TF32 flips torch's switches for the fixed side's blocks only; after the measurement they
    are back. The one model's first forward pass under each side's switches draws its dropout
    mask (SqueezeNet's classifier, in training) from the seed each time, so the outputs match
    (the CPU has no TF32 path): drawn one after the other, they differed by 0.087 relative L2."""
    before = Switches.current()
    done = measure_zoo(
        "torchvision:squeezenet1_1", 2, "train", "cpu", "tf32", blocks=2, iterations=1
    )
    assert Switches.current() == before
    assert done.numerics is not None and done.numerics["comparable"]
    assert done.numerics["relative_l2"] == 0.0


@pytest.fixture(scope="module")
def verified_in_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, verifying.RuleResult]:
    """channels_last verified for resnet18 b2 training on the CPU, 2 processes."""
    root = tmp_path_factory.mktemp("in-process")
    original = verifying.Original(
        root=root,
        profile=ProfileSpec(
            iterations=2, warmup=1, device="cpu", model="torchvision:resnet18", batch_size=2,
            mode="train",
        ),
        level_sets=(verifying.UNTRACED,),
        env={},
        cwd=root,
    )  # fmt: skip
    suggestion = verifying.Suggestion(
        rule="layout-transposes",
        advice="model.to(memory_format=torch.channels_last)",
        evidence="",
        gain_ms_per_iteration=1.0,
        share_pct=None,
        estimate="",
    )
    planned = verifying.Plan(original, [suggestion], rounds=2, in_process=True)
    seen: list[tuple[str, int, int]] = []
    done = verifying.run_plan(planned, lambda _, what, k, n: seen.append((what, k, n)))
    assert seen[-1] == ("process 2/2, both sides alternating", 2, 2)
    return root, done.results[0]


def test_in_process_rounds_give_the_row_and_the_runs(verified_in_process: tuple) -> None:
    root, result = verified_in_process
    row = result.row
    assert tuple(row) == verifying.ROW_KEYS
    assert row["status"] == verifying.MEASURED, row["status"]
    assert row["method"] == verifying.IN_ONE_PROCESS and row["rounds"] == 2
    low, high = row["measured_gain_ci_ms"]
    assert low <= row["measured_gain_ms_per_iteration"] <= high
    # 6 blocks of the measurement's 2 iterations a side, in each process
    assert [(r["round"], r["side"], r["iterations"]) for r in result.runs] == [
        (1, "base", 12), (1, "fixed", 12), (2, "base", 12), (2, "fixed", 12),
    ]  # fmt: skip
    for k in (1, 2):
        record = json.loads(
            (root / "verify" / "layout-transposes" / f"process-{k}" / RECORD_FILE).read_text()
        )
        assert record["block_order"] == [BASE, FIXED, FIXED, BASE] * 3
    # channels_last reorders memory, not arithmetic: the same output on the same weights
    assert result.numerics is not None and [c["round"] for c in result.numerics["rounds"]] == [1, 2]
    assert result.numerics["relative_l2"] < 1e-5
    line = verifying.summary_line(result)
    assert "(2 processes, both sides alternating in each)" in line
    written = json.loads((root / "verify" / "verify.json").read_text())
    assert written["rows"][0]["method"] == verifying.IN_ONE_PROCESS


def test_a_failed_process_says_why_in_one_line(tmp_path: Path) -> None:
    """The OOM killer's SIGKILL by name (the last stderr line is then any warning); else the
    process's own last line, as ``xsp: ...`` or a traceback's exception."""
    from xsp.campaign.in_process import STDERR_FILE, _why

    (tmp_path / STDERR_FILE).write_text("UserWarning: something\n")
    assert _why(tmp_path, -9) == "killed by SIGKILL"
    (tmp_path / STDERR_FILE).write_text("Traceback ...\nxsp: cannot build x:y: no such model\n")
    assert _why(tmp_path, 1) == "exit 1: xsp: cannot build x:y: no such model"


def test_the_process_runs_the_measurements_workload_with_its_own_fixes() -> None:
    from xsp.campaign.in_process import command

    profile = ProfileSpec(
        iterations=0, warmup=3, model="torchvision:resnet50", batch_size=64, mode="train",
        channels_last=True, fixes=("tf32",),
    )  # fmt: skip
    line = command(profile, "bf16", "cuda")
    assert line[line.index("--fix") + 1] == "bf16" and line[line.index("--applied") + 1] == "tf32"
    assert line[line.index("--iterations") + 1] == "10"  # a continuous run: blocks of 10 steps
    assert "--channels-last" in line and line[line.index("--batch-size") + 1] == "64"
