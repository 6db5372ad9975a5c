"""Warm-up until the step is steady: XSP's design rests on M being the true untraced step.

With two fixed warm-up steps the CPU demo measured M at 80.0 ms against MF's 35.5 ms, and an
inference loop took 20-32 ms for its first 18 steps and 0.24 ms after. So each warm-up step is
timed (on CUDA after a device sync, so the time is the GPU's too), and when the session drives
the loop it warms up past the minimum until the last ``WINDOW`` steps lie within ``TOLERANCE`` of
their median, or ``MAX_STEPS`` / ``MAX_SECONDS`` of warm-up have passed. ``run.json`` records the
steps it took (``warmup``), their times and whether they settled.
"""

from __future__ import annotations

import time

import torch

from xsp.core.run_sections import WarmupReport

__all__ = ["MAX_SECONDS", "MAX_STEPS", "TOLERANCE", "WINDOW", "WarmupClock", "settled"]

#: Steps whose spread decides, the spread allowed ((max - min) / median), and the bounds.
WINDOW = 4
TOLERANCE = 0.10
MAX_STEPS = 50
MAX_SECONDS = 60.0


def settled(steps_ns: list[int]) -> bool:
    """True when the last ``WINDOW`` steps lie within ``TOLERANCE`` of their median."""
    if len(steps_ns) < WINDOW:
        return False
    last = sorted(steps_ns[-WINDOW:])
    median = (
        (last[WINDOW // 2 - 1] + last[WINDOW // 2]) / 2 if WINDOW % 2 == 0 else last[WINDOW // 2]
    )
    return median > 0 and (last[-1] - last[0]) / median <= TOLERANCE


class WarmupClock:
    """Times the warm-up steps and says whether to warm up longer."""

    def __init__(self, device: str, minimum: int, settle: bool) -> None:
        self._cuda = device.startswith("cuda")
        self._minimum = minimum
        self._settle = settle
        self._began = 0
        self._first = 0
        self.steps_ns: list[int] = []
        self._dropped = 0  # steps timed at an earlier boundary (``restart``)

    def _now(self) -> int:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter_ns()

    def begin(self) -> None:
        self._began = self._now()
        self._first = self._first or self._began

    def end(self) -> None:
        if self._began:
            self.steps_ns.append(self._now() - self._began)
            self._began = 0

    def restart(self) -> None:
        """The steps timed so far ended at another boundary (forward passes, before a training
        loop's first optimizer step): time the step afresh from here."""
        self._dropped += len(self.steps_ns)
        self.steps_ns = []
        self._began = 0

    def longer(self) -> bool:
        """Warm up one more step: settling is on, the steps have not settled, and neither
        bound is reached."""
        if not self._settle or settled(self.steps_ns):
            return False
        spent = (time.perf_counter_ns() - self._first) / 1e9 if self._first else 0.0
        return len(self.steps_ns) < MAX_STEPS and spent < MAX_SECONDS

    def report(self) -> WarmupReport:
        """``run.json``'s warm-up fields."""
        return {
            "warmup_minimum": self._minimum,
            "warmup_settled": settled(self.steps_ns),
            "warmup_steps_ms": [round(n / 1e6, 3) for n in self.steps_ns],
            "warmup_steps_dropped": self._dropped,  # timed at an earlier boundary
        }
