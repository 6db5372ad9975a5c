"""The tracer's own cost per record, measured in the level-set process that pays it.

The replay (``xsp.analysis.replay``) takes host durations from the shallowest run with F and
must take F's own cost off them. Calibrating from that run's step against M's would make the
replay's check against M circular, so each process with F times the same small training step
with its levels off and on, just before and just after they come on (outside every iteration, so
nothing measured changes): a two-layer perceptron's forward (module calls, aten ops, allocations)
and backward (autograd nodes, gradient accumulation), on the CPU.

Each side is timed in ``ROUNDS`` rounds of ``CALLS`` steps; the medians' difference, on minus
off, divided by the F records one step wrote (read back from the capture arena), is the cost of
one record, allocator events and module calls folded in as the step has them. An in-place add
alone (one op record, no allocation) measured 0.32 µs a record on the H200's host; steps of real
models cost more per record, as their callbacks run with colder caches, so this is a lower bound
of F's cost. It is written into ``run.json`` as ``calibration``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

#: Steps per timed round, and rounds per side (about 10 ms a side on the dev machine).
CALLS = 50
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
    """Times the small step with the levels off (``before``) and on (``after``)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)  # the program's random state stays as it is
        self._model = torch.nn.Sequential(
            torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )
        self._input = torch.rand(4, 8, generator=generator)
        self._off: float | None = None
        self.result: dict[str, Any] | None = None

    def _step(self) -> None:
        self._model(self._input).sum().backward()

    def before(self) -> None:
        """Time the step with the levels still off. Never raises."""
        try:
            with torch.enable_grad():
                _per_call_ns(self._step)  # warm: the first calls pay dispatch set-up
                self._off = _per_call_ns(self._step)
        except Exception:
            log.exception("xsp: calibration (levels off) failed; host durations keep F's cost")

    def after(self, records: Callable[[], int]) -> None:
        """Time the step with the levels on, count the F records it wrote (``records()``: how
        many the arena holds), and keep the cost per record. Never raises."""
        if self._off is None:
            return
        try:
            with torch.enable_grad():
                self._step()  # warm, as before
                held = records()
                on = _per_call_ns(self._step)
                per_step = (records() - held) / (ROUNDS * CALLS)
        except Exception:
            log.exception("xsp: calibration (levels on) failed; host durations keep F's cost")
            return
        if per_step <= 0:
            return
        self.result = {
            "framework_ns_per_record": round(max(0.0, on - self._off) / per_step, 1),
            "records_per_step": per_step,
            "step_off_ns": round(self._off, 1),
            "step_on_ns": round(on, 1),
            "calls": CALLS,
            "rounds": ROUNDS,
        }
