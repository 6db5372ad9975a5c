"""xsp and the program's own torch.profiler in one process (``xsp.tracer.capture.hooks.coexist``): the
decisions on CPU, the steps aside a real CPU profiler causes, and a self-profiling training
script under ``xsp run`` that keeps its own events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from xsp.tracer.capture.hooks.coexist import CUPTI, MEMORY, ProgramProfiler, plan, reason
from xsp.tracer.export.finish import capture_losses

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "self_profiling_train.py"


def test_what_steps_aside_for_the_programs_profiler() -> None:
    # F's memory events leave the thread's profiler state whatever the profiler records
    assert plan(["CPU"], memory_on=True, cupti_on=False, shared_cupti=False).memory
    # CUPTI only for a profiler of a device, and only without a shared subscription
    assert not plan(["CPU"], memory_on=True, cupti_on=True, shared_cupti=False).cupti
    assert plan(["CPU", "CUDA"], memory_on=False, cupti_on=True, shared_cupti=False).cupti
    assert not plan(["CPU", "CUDA"], memory_on=False, cupti_on=True, shared_cupti=True).cupti
    # a profiler started before xsp could see it: its activities are unknown, so CUPTI too
    assert plan([], memory_on=False, cupti_on=True, shared_cupti=False).cupti
    assert not plan(["CUDA"], memory_on=False, cupti_on=False, shared_cupti=False).cupti


def test_one_line_says_what_xsp_could_not_record() -> None:
    assert reason([], [], "LG", "why") == (None, False)
    line, spans_missing = reason([2, 3, 4], [], "", "why")
    assert not spans_missing and line is not None
    assert "3 measured iterations (2, 3, 4)" in line and "memory events" in line
    line, spans_missing = reason([3], [3, 4], "LG", "PyTorch 2.11: none shared")
    assert spans_missing and line is not None and "\n" not in line
    assert "levels L and G stepped aside" in line and "PyTorch 2.11" in line
    # the line becomes a status reason (partial) only when spans are missing
    counts = {"program_profiler": {"line": line, "spans_missing": True}}
    assert capture_losses(counts) == [line]
    assert capture_losses({"program_profiler": {"line": "x", "spans_missing": False}}) == []


def test_a_cpu_profiler_with_a_schedule_steps_memory_aside_and_back() -> None:
    watch = ProgramProfiler()
    events: list[str] = []
    watch.listen(MEMORY, lambda: events.append("memory aside"), lambda: events.append("back"))
    watch.listen(CUPTI, lambda: events.append("cupti aside"), lambda: events.append("cupti back"))
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    calls = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda p: calls.append(sum(e.count for e in p.key_averages())),
    ) as prof:
        for i in range(6):
            watch.begin_iteration(MEMORY, i)
            model(x).sum().backward()
            prof.step()
            watch.end_iteration(MEMORY, i)
    # its warm-up takes nothing of xsp's; its start takes the thread's slot, its stop gives it back
    assert events == ["memory aside", "back"]
    assert calls and calls[0] > 0
    assert sorted(watch.iterations[MEMORY]) == [1, 2, 3]  # enabled at the end of 1, off in 3
    assert not watch.iterations[CUPTI]
    summary = watch.summary()
    assert summary["activities"] == ["CPU"] and not summary["spans_missing"]


def _counts(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_self_profiling_script_keeps_its_events_under_m_and_mf(tmp_path: Path) -> None:
    python = sys.executable
    # the CPU case, on any machine (a GPU's: benchmarks/coexist_gpu.sh)
    args = [str(WORKLOAD), "--steps", "20", "--device", "cpu"]
    alone = tmp_path / "alone.jsonl"
    subprocess.run([python, *args, "--counts", str(alone)], check=True, cwd=ROOT)
    (own,) = _counts(alone)
    assert own["traces"] and all(t["cpu_op_calls"] > 0 for t in own["traces"])

    under = tmp_path / "under.jsonl"
    out = tmp_path / "run"
    command = [python, "-m", "xsp", "run", "--levels", "M,MF,MFL", "--iterations", "5"]
    command += ["--device", "cpu"]
    command += ["--warmup", "2", "--out", str(out), "--", python, *args, "--counts", str(under)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes = _counts(under)
    assert len(processes) >= 2  # M (in its processes) and MF
    for seen in processes:  # the same op events in every trace, the same numbers
        assert seen["traces"] == own["traces"]
        assert seen["final_loss"] == own["final_loss"]
    meta = json.loads((out / "MF" / "run.json").read_text())
    assert meta["status"] == "ok", meta["status_reasons"]
    program = meta["program_profiler"]
    assert program["activities"] == ["CPU"] and not program["spans_missing"]
    assert program["memory_iterations"]  # the profiler ran inside the measured window
    assert program["line"] in done.stderr  # the one line, on stderr
    assert meta["memory_events"] > 0  # xsp's memory events outside the profiler's windows
