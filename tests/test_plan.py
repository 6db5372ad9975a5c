"""A leveled measurement's plan (xsp.tracer.run.plan): checked once, then trusted by the runner."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from xsp.core.errors import ConfigError
from xsp.core.levelset import LevelSet, continuous_counters
from xsp.tracer.run import plan as plans
from xsp.tracer.run import runner
from xsp.tracer.run.plan import LeveledSpec, RunPlan, plan
from xsp.tracer.spec import ProfileSpec

ROOT = Path(__file__).resolve().parents[1]

TWO_ITERATIONS = """
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
"""


def _spec(tmp_path: Path, device: str | None = "cpu") -> LeveledSpec:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(TWO_ITERATIONS.format(root=str(ROOT))))
    return LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=2, warmup=0, device=device, command=(sys.executable, str(script))
        ),
        level_sets=("M", "MF"),
        interleave=False,
    )


def _count_level_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from xsp.tracer.capture import levels as capture_levels

    checked: list[str] = []
    check = capture_levels.check_levels

    def counted(levels: LevelSet, device: str) -> None:
        checked.append(str(levels))
        check(levels, device)

    monkeypatch.setattr(capture_levels, "check_levels", counted)
    return checked


def test_the_level_sets_are_checked_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = _count_level_checks(monkeypatch)
    run_plan = plan(_spec(tmp_path))
    assert checked == ["M", "MF"]
    assert run_plan.level_sets == ("M", "MF") and run_plan.device == "cpu"

    def no_second_plan(spec: LeveledSpec) -> RunPlan:
        raise AssertionError("the runner checked the plan again")

    monkeypatch.setattr(runner, "plan", no_second_plan)
    monkeypatch.setattr(plans, "plan", no_second_plan)
    result = runner.run_leveled(run_plan)
    assert result.ok, result.failure
    assert checked == ["M", "MF"]  # the runner trusted the plan


def test_a_device_chosen_for_none_is_checked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.core import devices

    checked = _count_level_checks(monkeypatch)
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    assert plan(_spec(tmp_path, device=None)).device == "cpu"
    assert checked == ["M", "MF"]


def test_a_spec_is_planned_once_by_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a spec, the runner plans it itself, once; bad input is refused before any
    process starts."""
    calls: list[LeveledSpec] = []

    def counted(spec: LeveledSpec) -> RunPlan:
        calls.append(spec)
        return plan(spec)

    monkeypatch.setattr(runner, "plan", counted)
    spec = _spec(tmp_path, device="tpu")
    with pytest.raises(ConfigError, match="bad device 'tpu'"):
        runner.run_leveled(spec)
    assert calls == [spec] and not spec.out.exists()


def test_a_service_cannot_run_the_counter_level() -> None:
    """One wording for the rule, wherever it is checked (``continuous_counters``)."""
    service = ProfileSpec(iterations=0, model="torchvision:resnet18")
    with pytest.raises(ConfigError) as refused:
        plans._check_service(service, [LevelSet("MH")])
    assert str(refused.value) == continuous_counters(LevelSet("MH"))
    assert str(refused.value).startswith("level set MH: level H cannot run in a continuous")
