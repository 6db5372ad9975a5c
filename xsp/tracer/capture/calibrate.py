"""The tracer's own cost per record, measured in the level-set process that pays it.

The replay (``xsp.analysis.replay``) takes host durations from the shallowest run with F and
must take F's own cost off them. Calibrating from that run's step against M's would make the
replay's check against M circular, so that run's process times two small probes with F's
recording off and on, just after the levels come on (outside every iteration, so nothing
measured changes), on the program's GPU when it has started CUDA, else on the CPU. (A session
started by hand calibrates whenever it has F; the leveled runner leaves the calibration to the
shallowest level set with F, ``ProfileSpec.calibrate``.) The probes:

- a two-layer perceptron's training step: module calls, aten ops and their allocations, autograd
  nodes and gradient accumulation;
- a chain of ``MODULE_CHAIN`` ``nn.Identity`` modules, which run no op: module records alone.

Each probe is timed in ``ROUNDS`` rounds; a round times ``CALLS`` calls with F's recording off
and the same calls with it on, right after (F's sampling switch, ``FrameworkLevel.sample``), so
that the host's drift over the calibration falls on both sides of each difference. The median
difference over the records the probe wrote (read back from the capture arena by kind) gives
the cost of a module record (the chain) and of an op record (the step less its module calls),
allocator events folded in as the step has them. Levels below F stay as they are on both sides:
the calibration prices F's records alone.

Timing all the levels-off rounds first and the levels-on ones after (as this module did before)
let a process's drift between the two halves pass for F's cost: on the H200, one MF process in
six came out at 2.2 µs a record where the others gave 0.51-0.57 µs. In pairs of 20 calls and 5
rounds, the calibration takes 0.08-0.10 s of the process (0.22-0.34 s in 7 halves of 50 calls
each), and every replay came within 1% of its MF process's own untraced steps
(``benchmarks/calibration_spread.py``, ``docs/measured.md``).

On the GPU each op also launches a kernel and the caching allocator reports its blocks, so the
callbacks run amid the driver's work, as the workload's do: on the H200 the same step on the CPU
gave 0.8-1.6 µs a record, on the GPU 1.8-3.3 µs, where host-bound workloads' MF steps paid
1.7-4.5 µs a record more than their M steps. The result goes into ``run.json`` as
``calibration``. The replay raises the cost where its F run's own untraced steps show more
(``xsp.analysis.replay.fit``), never lowers it.

Level F records the ops' shapes (in the deepest level set with F: the runner leaves them to it)
in the first measured iteration only, since boxing each op's inputs costs; there each round
also times the step with the shapes off: ``framework_ns_per_record`` is what the later
iterations pay a record, ``framework_ns_per_record_first_iteration`` what the first pays. The
replay reads its host from the shallowest F run, which records shapes only when it is the
deepest one too (a measurement of M and MF alone).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from xsp.core.arena import KIND_MODULE, KIND_OP, KIND_RANGE
from xsp.core.run_sections import CalibrationProbe, CalibrationResult

__all__ = ["CALLS", "MODULE_CHAIN", "ROUNDS", "WARM_CALLS", "Calibration"]

log = logging.getLogger(__name__)

#: Calls per timed half-round, and rounds (pairs of halves) per probe.
CALLS = 20
ROUNDS = 5
#: Calls that warm a probe up, levels off, before it is timed: the first calls pay set-up.
WARM_CALLS = 20
#: Modules in the chain that times a module record.
MODULE_CHAIN = 16

#: The record kinds each count reads from the arena.
_KINDS = {"ops": (KIND_OP, KIND_RANGE), "modules": (KIND_MODULE,)}


def _per_call_ns(work: Callable[[], Any], settle: Callable[[], Any]) -> float:
    settle()  # each half starts with the GPU idle: no queue left from the one before
    begin = time.perf_counter_ns()
    for _ in range(CALLS):
        work()
    return (time.perf_counter_ns() - begin) / CALLS


def _program_device() -> torch.device:
    """The GPU the program uses, if it has started CUDA (never starts it itself)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _training() -> contextlib.ExitStack:
    """Gradients on, even inside the program's ``torch.inference_mode()`` block (the levels of
    an inference script come on there), where ``enable_grad`` alone leaves backward failing."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


class _Probe:
    """One piece of work timed with F off and on, with the records it writes per call."""

    def __init__(self, work: Callable[[], Any], with_shapes: bool = True) -> None:
        self.work = work
        self.with_shapes = with_shapes
        self.offs: list[float] = []
        self.differences: list[float] = []
        self.records: dict[str, float] = {}

    def cost(self) -> float:
        return max(0.0, statistics.median(self.differences))

    def summary(self) -> CalibrationProbe:
        off = statistics.median(self.offs)
        return {
            "off_ns": round(off, 1),
            "on_ns": round(off + statistics.median(self.differences), 1),
            "records": self.records,
        }


class Calibration:
    """Times two probes with F off and on in pairs of rounds: the small training step (ops,
    allocations, autograd nodes and a few module calls) and a chain of modules that run no op
    (``nn.Identity``), whose cost per call is the module record's. The step's cost less its
    module calls', per op record, is the op record's: a model with many small modules
    (ResNet-50 b1, 18% of its records) pays more per record than one with few (a GPT, 2%)."""

    def __init__(self) -> None:
        self._device = torch.device("cpu")
        self._probes: dict[str, _Probe] = {}
        self.result: CalibrationResult | None = None

    def _build(self) -> None:
        self._device = device = _program_device()
        # the program's random state stays as it is: Linear's initialisation draws from the
        # global generator, which the program's later draws (shuffles, dropout) read on
        with torch.random.fork_rng(devices=[]):
            generator = torch.Generator().manual_seed(0)
            layers = (torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
            mlp = torch.nn.Sequential(*layers).to(device)
            x = torch.rand(4, 8, generator=generator).to(device)
        chain = torch.nn.Sequential(*(torch.nn.Identity() for _ in range(MODULE_CHAIN)))
        self._probes = {
            "step": _Probe(lambda: mlp(x).sum().backward()),
            "modules": _Probe(lambda: chain(x)),
        }

    def _settle(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def before(self) -> None:
        """Build the probes and warm them up, with the levels still off. Never raises."""
        try:
            with _training():
                self._build()  # outside inference mode: its parameters must take gradients
                for probe in self._probes.values():
                    for _ in range(WARM_CALLS):
                        probe.work()
                    self._settle()
        except Exception:
            self._probes = {}
            log.exception("xsp: calibration (levels off) failed; host durations keep F's cost")

    def after(
        self,
        records: Callable[[tuple[int, ...]], int],
        switch: Callable[[bool], None],
        shapes: Callable[[bool], None] | None = None,
    ) -> None:
        """Time the probes in rounds of F off and on (``switch``), count the records of each
        kind they wrote (``records(kinds)``: how many the arena holds), and keep the cost of a
        module record and of an op record. ``shapes`` switches the ops' shapes off and on again
        when F records them in the first measured iteration only: the step is then timed both
        ways, as the first iteration and the later ones pay. F is left recording, with its
        shapes. Never raises."""
        if not self._probes:
            return
        if shapes is not None:
            self._probes["step_without_shapes"] = _Probe(self._probes["step"].work, False)
        try:
            with _training():
                for round_ in range(ROUNDS):
                    for probe in self._probes.values():
                        self._time_pair(probe, records if round_ == 0 else None, switch, shapes)
        except Exception:
            log.exception("xsp: calibration (levels on) failed; host durations keep F's cost")
            return
        finally:
            with contextlib.suppress(Exception):
                switch(True)
                if shapes is not None:
                    shapes(True)  # the first measured iteration records them
        self._keep(with_shapes_apart=shapes is not None)

    def _time_pair(
        self,
        probe: _Probe,
        records: Callable[[tuple[int, ...]], int] | None,
        switch: Callable[[bool], None],
        shapes: Callable[[bool], None] | None,
    ) -> None:
        """One round of ``probe``: its calls with F off, then with F on. ``records`` is given
        in the first round only: each round writes the same records, and a count reads the
        whole arena."""
        switch(False)
        off = _per_call_ns(probe.work, self._settle)
        switch(True)
        if shapes is not None:
            shapes(probe.with_shapes)
        held = {kind: records(k) for kind, k in _KINDS.items()} if records else {}
        on = _per_call_ns(probe.work, self._settle)
        if records:
            probe.records = {kind: (records(k) - held[kind]) / CALLS for kind, k in _KINDS.items()}
        probe.offs.append(off)
        probe.differences.append(on - off)

    def _keep(self, with_shapes_apart: bool) -> None:
        modules = self._probes["modules"]
        if modules.records.get("modules", 0) <= 0:
            return
        module_ns = modules.cost() / modules.records["modules"]
        with_shapes = self._op_ns(self._probes["step"], module_ns)
        op_ns = self._op_ns(
            self._probes.get("step_without_shapes", self._probes["step"]), module_ns
        )
        if with_shapes is None or op_ns is None:
            return
        self.result = {
            "framework_ns_per_record": round(op_ns, 1),
            "module_ns_per_call": round(module_ns, 1),
            "probes": {name: probe.summary() for name, probe in self._probes.items()},
            "device": str(self._device),
            "calls": CALLS,
            "rounds": ROUNDS,
            "paired": True,
        }
        if with_shapes_apart:
            self.result["framework_ns_per_record_first_iteration"] = round(with_shapes, 1)

    @staticmethod
    def _op_ns(step: _Probe, module_ns: float) -> float | None:
        """An op record's cost: the step's added time less its module calls', per op record."""
        if step.records.get("ops", 0) <= 0:
            return None
        return max(0.0, step.cost() - module_ns * step.records["modules"]) / step.records["ops"]
