"""``xsp estimate RUN``: time the ops that each kernel-changing fix touches, in isolation on this
machine's device, and replay the step with those times (``xsp.analysis.estimates``).

For each fix (``--fix``, else the fixes of the measurement's suggestions that change kernels:
channels_last, tf32):

1. The ops it touches, as distinct cases with their recorded shapes
   (``xsp.analysis.estimates.cases``).
2. Each case timed without and with the fix, forward and (in training) backward, on the
   measurement's device (``xsp.tracer.workloads.isolation``), about ``budget_ms`` per timing.
3. The timings written to ``RUN/estimates/<fix>.json`` (``xsp.core.store.op_timings``), which
   ``xsp analyze`` and ``xsp verify`` then read: the suggestion's estimate becomes the replay with
   those times, "measured in isolation", where it was modelled.
4. The replayed gain, printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xsp.core.errors import XspError
from xsp.core.store.op_timings import CaseTiming, OpCase, OpTimings, write_timings

if TYPE_CHECKING:
    from xsp.analysis.measurement.store import MeasurementStore

__all__ = ["FixEstimate", "default_fixes", "estimate", "measurement_device", "summary_line"]

#: Called as each case is timed: (fix, cases timed, cases).
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FixEstimate:
    """One fix's isolated timings and the replay they give: ``gain_ms`` None where the replay
    found no step."""

    fix: str
    device: str
    path: Path
    cases: int
    ops_per_iteration: float
    timing_s: float
    gain_ms: float | None
    step_ms: float | None
    timings: list[CaseTiming]

    def record(self) -> dict[str, object]:
        return {
            "fix": self.fix,
            "device": self.device,
            "path": str(self.path),
            "cases": self.cases,
            "ops_per_iteration": self.ops_per_iteration,
            "timing_s": self.timing_s,
            "gain_ms_per_iteration": self.gain_ms,
            "step_ms": self.step_ms,
        }


def measurement_device(store: MeasurementStore) -> str:
    """The device the measurement ran on (its runs' ``xsp.device``), ``cpu`` where unsaid."""
    for run in store.runs:
        device = str(run.resource.get("xsp.device", "") or "")
        if device:
            return device
    return "cpu"


def default_fixes(store: MeasurementStore) -> list[str]:
    """The fixes of the measurement's suggestions whose fix changes kernels."""
    from xsp.analysis.estimates import TOUCHED
    from xsp.analysis.suggestions.rules import RULES_BY_NAME, suggest

    found = suggest(store).column("rule").to_pylist()
    fixes = [RULES_BY_NAME[rule].fix for rule in found if rule in RULES_BY_NAME]
    return [fix for fix in dict.fromkeys(fixes) if fix in TOUCHED]


def _check_device(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise XspError(
            f"the measurement ran on {device}: its ops are timed there, and no CUDA GPU is "
            "visible here (torch.cuda.is_available() is False)"
        )


def estimate(
    root: Path,
    fixes: Sequence[str] = (),
    budget_ms: float | None = None,
    device: str | None = None,
    progress: Progress | None = None,
) -> list[FixEstimate]:
    """Time and replay each fix (module notes); XspError, one line, for bad input."""
    from xsp.analysis.estimates import TOUCHED, affected, isolation_estimate, kernels_to_scale
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.core.errors import StoreError
    from xsp.tracer.workloads.isolation import DEFAULT_BUDGET_MS

    if not root.is_dir():
        raise XspError(f"{root}: no such measurement directory")
    unknown = [fix for fix in fixes if fix not in TOUCHED]
    if unknown:
        raise XspError(
            f"fix {unknown[0]!r} changes no op that can be timed alone: use {', '.join(TOUCHED)}"
        )
    try:
        store = MeasurementStore(root)
        store.require_spans()
    except StoreError as exc:
        raise XspError(str(exc)) from exc
    if not kernels_to_scale(store):
        raise XspError(
            f"{root}: a GPU measurement without level G: its ops' kernels, which the timings "
            "scale, were not recorded (measure with MFLG)"
        )
    device = device or measurement_device(store)
    chosen = list(fixes) or default_fixes(store)
    if not chosen:
        raise XspError(
            f"{root}: no suggestion's fix changes kernels; name one with --fix "
            f"({', '.join(TOUCHED)})"
        )
    _check_device(device)
    out = []
    for fix in chosen:
        found = affected(store, fix)
        if not found.cases:
            raise XspError(f"{root}: {fix} touches no op of the measurement (no shapes?)")
        budget = budget_ms or DEFAULT_BUDGET_MS
        timings, seconds = _time_cases(found.cases, fix, device, budget, progress)
        path = write_timings(root, _document(found.cases, fix, device, timings))
        replayed = isolation_estimate(store, fix)
        out.append(
            FixEstimate(
                fix=fix,
                device=device,
                path=path,
                cases=len(found.cases),
                ops_per_iteration=sum(c.per_iteration for c in found.cases),
                timing_s=seconds,
                gain_ms=replayed.gain_ms if replayed else None,
                step_ms=replayed.step_ms if replayed else None,
                timings=timings,
            )
        )
    return out


def _time_cases(
    cases: Sequence[OpCase],
    fix: str,
    device: str,
    budget_ms: float,
    progress: Progress | None,
) -> tuple[list[CaseTiming], float]:
    from xsp.tracer.workloads.isolation import time_case

    begin = time.perf_counter()
    timings = []
    for i, case in enumerate(cases):
        timings.append(time_case(case, fix, device, budget_ms))
        if progress is not None:
            progress(fix, i + 1, len(cases))
    return timings, time.perf_counter() - begin


def _document(
    cases: Sequence[OpCase], fix: str, device: str, timings: list[CaseTiming]
) -> OpTimings:
    import torch

    where = device
    if device.startswith("cuda"):
        where = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return OpTimings(fix, where, str(torch.__version__), list(cases), timings)


def summary_line(found: FixEstimate) -> str:
    """``fix: N ops a step (K shapes) timed in S s on DEVICE; replayed gain G ms (P% of a T ms
    step)``."""
    line = (
        f"{found.fix}: {found.ops_per_iteration:.0f} ops a step ({found.cases} shapes) timed "
        f"without and with it in {found.timing_s:.1f} s on {found.device}"
    )
    if found.gain_ms is None or not found.step_ms:
        return line + "; the replay found no step to apply them to"
    share = 100.0 * found.gain_ms / found.step_ms
    return (
        f"{line}; replayed gain {found.gain_ms:.2f} ms a step ({share:.1f}% of a "
        f"{found.step_ms:.2f} ms step)"
    )
