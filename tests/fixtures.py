"""Recording and loading of raw-capture fixtures (tests/data/<scenario>/raw.json)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

from tracer.levels.framework import FrameworkLevel, FrameworkRecords, Interned, ModuleInfo
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


def to_json(records: FrameworkRecords) -> dict[str, Any]:
    """The fixture form of framework records: plain lists, shapes as lists."""
    return {
        "name": records.name.to_list(),
        "start_ns": list(records.start_ns),
        "end_ns": list(records.end_ns),
        "thread": list(records.thread),
        "fwd_thread": list(records.fwd_thread),
        "seq_nr": list(records.seq_nr),
        "input_shapes": records.input_shapes.to_list(),
        "input_dtypes": records.input_dtypes.to_list(),
        "modules": [vars(m) for m in records.modules],
        "call_module": list(records.call_module),
        "call_input_shapes": [[list(s) for s in shapes] for shapes in records.call_input_shapes],
        "call_output_shapes": {
            str(k): [list(s) for s in v] for k, v in records.call_output_shapes.items()
        },
    }


def load_json(scenario: str) -> dict[str, Any]:
    return dict(json.loads((DATA / scenario / "raw.json").read_text()))


def load_raw(scenario: str) -> tuple[StepRecords, FrameworkRecords, dict[str, Any]]:
    return from_json(load_json(scenario))


def from_json(data: dict[str, Any]) -> tuple[StepRecords, FrameworkRecords, dict[str, Any]]:
    """Rebuild the drained records from their fixture form."""
    fw = dict(data["framework"])
    for key in ("name", "input_shapes", "input_dtypes"):
        fw[key] = Interned(fw[key])
    for key in ("start_ns", "end_ns", "thread", "fwd_thread", "seq_nr"):
        fw[key] = array("q", fw[key])
    fw["modules"] = [ModuleInfo(**m) for m in fw["modules"]]
    fw["call_input_shapes"] = [
        tuple(tuple(s) for s in shapes) for shapes in fw["call_input_shapes"]
    ]
    fw["call_output_shapes"] = {
        int(k): tuple(tuple(s) for s in v) for k, v in fw["call_output_shapes"].items()
    }
    return StepRecords(**data["steps"]), FrameworkRecords(**fw), data["meta"]
