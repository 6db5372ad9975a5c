"""What a fix does to the numbers: the root module's first forward pass, recorded, so that runs
without and with a fix can be compared on the same inputs.

The first forward pass comes before any optimizer step, so a training run's weights are still
the ones it was built with: a seeded program (every zoo model) computes it on the same weights
and inputs in every run, and any difference in its output is the fix's (TF32, bf16 autocast).
``record`` keeps a checksum of the inputs (so a comparison can tell whether they were the same),
and the output's first ``SAMPLE_VALUES`` values, in ``RUN_DIR/<levels>/numerics.json``;
``compare`` measures two such records against each other.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Required, TypedDict, cast

log = logging.getLogger(__name__)

PROBE_FILE = "numerics.json"
#: Output values kept: enough for a relative error, small beside a run's spans.
SAMPLE_VALUES = 4096


class OutputRecord(TypedDict):
    """A first forward pass as recorded (``numerics.json``)."""

    input_checksum: list[float]  # each input tensor's float64 sum
    input_shapes: list[list[int]]
    output_values: int  # the floating output values, all of them
    output_sample: list[float]  # the first SAMPLE_VALUES of them


class Comparison(TypedDict, total=False):
    """Two records measured (``compare``): the distances when comparable, else why not."""

    comparable: Required[bool]
    why: str
    values_compared: int
    relative_l2: float
    max_abs: float


def _tensors(value: Any) -> Iterator[Any]:
    """Every tensor in an output or argument structure, in a stable order (dicts and model
    outputs by key order, tuples and lists in order)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict) or hasattr(value, "values"):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def summarize(inputs: Any, output: Any) -> OutputRecord:
    """The inputs' checksum (float64 sum and shapes of every tensor) and the first
    ``SAMPLE_VALUES`` values of the output's floating tensors, in float64."""
    import torch

    with torch.no_grad():
        given = list(_tensors(inputs))
        checksum = [float(t.detach().double().sum().item()) for t in given]
        shapes = [list(t.shape) for t in given]
        values: list[float] = []
        count = 0
        for tensor in _tensors(output):
            if not tensor.is_floating_point():
                continue
            count += tensor.numel()
            room = SAMPLE_VALUES - len(values)
            if room > 0:
                values += tensor.detach().flatten()[:room].double().cpu().tolist()
    return {
        "input_checksum": checksum,
        "input_shapes": shapes,
        "output_values": count,
        "output_sample": values,
    }


def record(module: Any, path: Path) -> None:
    """Write ``summarize`` of ``module``'s next forward pass to ``path``, once. Never raises
    into the program: a failure is logged."""
    handle: Any = None

    def after_forward(_: Any, args: Any, kwargs: Any, output: Any) -> None:
        handle.remove()
        try:
            path.write_text(json.dumps(summarize((args, kwargs), output)))
        except Exception as exc:
            log.warning("xsp: cannot record the first forward pass's output: %s", exc)

    import torch

    # run eagerly under the compile fix: the probe reads values back, which a graph cannot
    try:
        handle = module.register_forward_hook(
            torch.compiler.disable(after_forward), with_kwargs=True
        )
    except Exception as exc:  # a ScriptModule takes no hooks: no record, the program runs on
        log.warning("xsp: cannot record the first forward pass's output: %s", exc)


def read(run_dir: Path) -> OutputRecord | None:
    """A run's record, or None when it has none (or an unreadable one)."""
    try:
        found = json.loads((run_dir / PROBE_FILE).read_text())
    except (OSError, ValueError):
        return None
    # an object is taken as written by ``record``: ``compare`` reads its keys with defaults
    return cast(OutputRecord, found) if isinstance(found, dict) else None


def compare(base: OutputRecord, fixed: OutputRecord) -> Comparison:
    """How far ``fixed``'s output lies from ``base``'s: ``relative_l2`` (the norm of the
    difference over the norm of base's values) and ``max_abs`` over the kept values, when both
    ran on the same inputs; else ``comparable`` False with the reason."""
    if base.get("input_shapes") != fixed.get("input_shapes") or not _close(
        base.get("input_checksum") or [], fixed.get("input_checksum") or []
    ):
        return {"comparable": False, "why": "the first forward pass's inputs differ (unseeded)"}
    a, b = base.get("output_sample") or [], fixed.get("output_sample") or []
    if not a or len(a) != len(b):
        return {"comparable": False, "why": "the outputs differ in size"}
    difference = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))
    norm = math.sqrt(sum(x * x for x in a))
    return {
        "comparable": True,
        "values_compared": len(a),
        "relative_l2": difference / norm if norm else difference,
        "max_abs": max(abs(x - y) for x, y in zip(a, b, strict=True)),
    }


def _close(a: list[float], b: list[float]) -> bool:
    """Input checksums of the same inputs (a layout change can reorder a float sum)."""
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b, strict=True)
    )


__all__ = ["PROBE_FILE", "Comparison", "OutputRecord", "compare", "read", "record", "summarize"]
