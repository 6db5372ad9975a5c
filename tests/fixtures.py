"""Recording and loading of raw-capture fixtures (tests/data/<scenario>/raw.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracer.levels.framework import FrameworkLevel, FrameworkRecords, ModuleInfo
from tracer.levels.model import ModelLevel, StepRecords

DATA = Path(__file__).parent / "data"


def capture_raw(
    model: str, mode: str, batch_size: int, device: str, iterations: int
) -> tuple[StepRecords, FrameworkRecords, dict[str, Any]]:
    """Run a zoo workload with levels M and F driven by hand, and return what they drained."""
    import torch

    from tracer import zoo

    workload = zoo.build(model, batch_size, mode, device)
    workload.step()  # warm-up: allocator, cuDNN/cuBLAS handles
    m, f = ModelLevel(device), FrameworkLevel()
    f.enable()
    for i in range(iterations):
        m.begin_iteration(i)
        f.begin_iteration(i)
        workload.step()
        f.end_iteration(i)
        m.end_iteration(i)
    f.disable()
    named = [name for name, _ in workload.model.named_modules()]
    meta = {
        "model": model,
        "mode": mode,
        "batch_size": batch_size,
        "device": device,
        "torch": torch.__version__,
        "named_modules": named,
    }
    return m.drain(), f.drain(), meta


def load_raw(scenario: str) -> tuple[StepRecords, FrameworkRecords, dict[str, Any]]:
    data = json.loads((DATA / scenario / "raw.json").read_text())
    fw = data["framework"]
    fw["modules"] = [ModuleInfo(**m) for m in fw["modules"]]
    fw["call_input_shapes"] = [
        tuple(tuple(s) for s in shapes) for shapes in fw["call_input_shapes"]
    ]
    fw["call_output_shapes"] = {
        int(k): tuple(tuple(s) for s in v) for k, v in fw["call_output_shapes"].items()
    }
    return StepRecords(**data["steps"]), FrameworkRecords(**fw), data["meta"]
