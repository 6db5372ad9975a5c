"""The tracer's own cost per record, measured in the level-set process that pays it.

The replay (``xsp.analysis.replay``) takes host durations from the shallowest run with F and
must take F's own cost off them. Calibrating from that run's step against M's would make the
replay's check against M circular, so each process with F times the same small work with its
levels off and on, just before and just after they come on (outside every iteration, so nothing
measured changes):

1. an in-place add on a one-element CPU tensor: one aten op, one op record;
2. a call of an empty module (``nn.Identity``): one module record, no op.

Each is timed in ``ROUNDS`` rounds of ``CALLS`` calls; the medians' difference, on minus off, is
the cost of one record. It is written into ``run.json`` as ``calibration``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

#: Calls per timed round, and rounds per side (about 5 ms a side on the dev machine).
CALLS = 400
ROUNDS = 7


def _per_call_ns(work: Callable[[], Any]) -> float:
    rounds = []
    for _ in range(ROUNDS):
        begin = time.perf_counter_ns()
        for _ in range(CALLS):
            work()
        rounds.append((time.perf_counter_ns() - begin) / CALLS)
    return statistics.median(rounds)


class Calibration:
    """Times the small work with the levels off (``before``) and on (``after``)."""

    def __init__(self) -> None:
        self._tensor = torch.zeros(1)
        self._one = torch.ones(1)
        self._module = torch.nn.Identity()
        self._off: tuple[float, float] | None = None
        self.result: dict[str, Any] | None = None

    def _time(self) -> tuple[float, float]:
        tensor, one, module = self._tensor, self._one, self._module
        with torch.no_grad():
            return _per_call_ns(lambda: tensor.add_(one)), _per_call_ns(lambda: module(one))

    def before(self) -> None:
        """Time the work with the levels still off. Never raises."""
        try:
            self._time()  # warm: the first calls pay dispatch set-up
            self._off = self._time()
        except Exception:
            log.exception("xsp: calibration (levels off) failed; host durations keep F's cost")

    def after(self) -> None:
        """Time the work with the levels on and keep the difference. Never raises."""
        if self._off is None:
            return
        try:
            on = self._time()
        except Exception:
            log.exception("xsp: calibration (levels on) failed; host durations keep F's cost")
            return
        (op_off, module_off), (op_on, module_on) = self._off, on
        self.result = {
            "framework_ns_per_record": round(max(0.0, op_on - op_off), 1),
            "module_ns_per_call": round(max(0.0, module_on - module_off), 1),
            "op_off_ns": round(op_off, 1),
            "op_on_ns": round(op_on, 1),
            "module_off_ns": round(module_off, 1),
            "module_on_ns": round(module_on, 1),
            "calls": CALLS,
            "rounds": ROUNDS,
        }
