"""The leveled runner's overlapped start: a level set's process starts while the one before
finishes, but measures only once that one has exited."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tracer.runner import LeveledSpec, run_leveled
from tracer.store import open_measurement

ROOT = Path(__file__).resolve().parents[1]


def test_an_overlapped_level_set_switches_its_levels_on_after_the_one_before_exited(
    tmp_path: Path,
) -> None:
    spec = LeveledSpec(
        out=tmp_path / "R",
        level_sets=("M", "MF"),
        iterations=3,
        warmup=2,
        device="cpu",
        model="torchvision:squeezenet1_1",
        fork_server=True,
        overlap=True,
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    runs = {run.levels: run.meta for run in open_measurement(spec.out)}
    assert runs["M"]["finished_ns"] < runs["MF"]["phases_ns"]["levels_on"]
    assert runs["MF"]["phases_ns"]["ready"] <= runs["MF"]["phases_ns"]["levels_on"]
    seconds = {entry["levels"]: entry["seconds"] for entry in result.runs}
    assert "waiting_for_previous" in seconds["MF"] and "waiting_for_previous" not in seconds["M"]
    assert runs["MF"]["spans_by_level"]["framework"] > 0


FAILS_AFTER_MEASURING = """
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
    raise RuntimeError("failed after measuring")
"""


def test_a_level_set_that_fails_cancels_the_one_started_ahead_of_it(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(FAILS_AFTER_MEASURING.format(root=str(ROOT))))
    spec = LeveledSpec(
        out=tmp_path / "R",
        level_sets=("M", "MF"),
        iterations=2,
        warmup=0,
        device="cpu",
        command=(sys.executable, str(script)),
        log_stderr=True,
        overlap=True,
    )
    events: list[tuple[str, str]] = []
    result = run_leveled(spec, progress=lambda levels, phase, *_: events.append((levels, phase)))
    assert ("MF", "start") in events  # started once M had measured, then dropped
    assert not result.ok
    assert [entry["levels"] for entry in result.runs] == ["M"]
    assert "failed after measuring" in (spec.out / "M.stderr.log").read_text()
    assert not (spec.out / "MF").exists() and not (spec.out / "MF.stderr.log").exists()
    manifest = json.loads((spec.out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and len(manifest["runs"]) == 1
