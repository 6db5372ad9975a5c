"""The tracer's own cost per record, measured in the level-set process that pays it.

The replay (``xsp.analysis.replay``) takes host durations from the shallowest run with F and
must take F's own cost off them. Calibrating from that run's step against M's would make the
replay's check against M circular, so that run's process times two small probes with its levels
off and on, just before and just after they come on (outside every iteration, so nothing
measured changes), on the program's GPU when it has started CUDA, else on the CPU. (A session
started by hand calibrates whenever it has F; the leveled runner leaves the calibration to the
shallowest level set with F, ``ProfileSpec.calibrate``.) The probes:

- a two-layer perceptron's training step: module calls, aten ops and their allocations, autograd
  nodes and gradient accumulation;
- a chain of ``MODULE_CHAIN`` ``nn.Identity`` modules, which run no op: module records alone.

Each side is timed in ``ROUNDS`` rounds of ``CALLS`` calls (the step with shapes, which prices
the first iteration alone, in ``FIRST_ITERATION_ROUNDS``); the medians' difference, on minus
off, over the records the probe wrote (read back from the capture arena by kind) gives the cost
of a module record (the chain) and of an op record (the step less its module calls), allocator
events folded in as the step has them. On the GPU each op also launches a kernel and the caching
allocator reports its blocks, so the callbacks run amid the driver's work, as the workload's do:
on the H200 the same step on the CPU gave 0.8-1.6 µs a record, on the GPU 1.8-3.3 µs, where
host-bound workloads' MF steps paid 1.7-4.5 µs a record more than their M steps (both processes'
steps drift by up to 40% on that host). The result goes into ``run.json`` as ``calibration``.

Level F records the ops' shapes (in the deepest level set with F: the runner leaves them to it)
in the first measured iteration only, since boxing each op's inputs costs; there the step probe
is timed with the shapes on and off: ``framework_ns_per_record`` is what the later iterations pay
a record, ``framework_ns_per_record_first_iteration`` what the first pays. The replay reads its
host from the shallowest F run, which records shapes only when it is the deepest one too (a
measurement of M and MF alone).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from xsp.tracer.convert.arena import KIND_MODULE, KIND_OP, KIND_RANGE

log = logging.getLogger(__name__)

#: Steps per timed round, and rounds per side (about 10 ms a side on the dev machine).
CALLS = 50
ROUNDS = 7
#: Modules in the chain that times a module record.
MODULE_CHAIN = 16
#: Rounds of the step with the ops' shapes on, which prices the first measured iteration only:
#: the replay's step is a median over the steady iterations, so fewer rounds serve it (about
#: 0.27 s less of an MFLG process's 1.1-1.7 s calibration on the H200, by its calls' time).
FIRST_ITERATION_ROUNDS = 3


def _warm(work: Callable[[], Any], settle: Callable[[], Any]) -> None:
    """One round's calls: the first calls pay set-up. Seven rounds (a whole timing) gave the
    same costs on the dev machine and were half the levels-off side's 0.35-0.43 s on the H200."""
    for _ in range(CALLS):
        work()
    settle()


def _per_call_ns(work: Callable[[], Any], settle: Callable[[], Any], times: int = ROUNDS) -> float:
    rounds = []
    for _ in range(times):
        settle()  # each round starts with the GPU idle: no queue left from the round before
        begin = time.perf_counter_ns()
        for _ in range(CALLS):
            work()
        rounds.append((time.perf_counter_ns() - begin) / CALLS)
    return statistics.median(rounds)


def _program_device() -> torch.device:
    """The GPU the program uses, if it has started CUDA (never starts it itself)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _training() -> Any:
    """Gradients on, even inside the program's ``torch.inference_mode()`` block (the levels of
    an inference script come on there), where ``enable_grad`` alone leaves backward failing."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


class _Probe:
    """One piece of work timed with the levels off and on, with the records it writes."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.off: float | None = None
        self.on: float | None = None
        self.records: dict[str, float] = {}

    def cost(self) -> float:
        assert self.off is not None and self.on is not None
        return max(0.0, self.on - self.off)


class Calibration:
    """Times two probes with the levels off (``before``) and on (``after``): the small training
    step (ops, allocations, autograd nodes and a few module calls) and a chain of modules that
    run no op (``nn.Identity``), whose cost per call is the module record's. The step's cost
    less its module calls', per op record, is the op record's: a model with many small modules
    (ResNet-50 b1, 18% of its records) pays more per record than one with few (a GPT, 2%)."""

    def __init__(self) -> None:
        self._device = torch.device("cpu")
        self._probes: dict[str, _Probe] = {}
        self.result: dict[str, Any] | None = None

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
        """Time the probes with the levels still off. Never raises."""
        try:
            with _training():
                self._build()  # outside inference mode: its parameters must take gradients
                for probe in self._probes.values():
                    _warm(probe.work, self._settle)
                    probe.off = _per_call_ns(probe.work, self._settle)
        except Exception:
            self._probes = {}
            log.exception("xsp: calibration (levels off) failed; host durations keep F's cost")

    def after(
        self,
        records: Callable[[tuple[int, ...]], int],
        shapes: Callable[[bool], None] | None = None,
    ) -> None:
        """Time the probes with the levels on, count the records of each kind they wrote
        (``records(kinds)``: how many the arena holds), and keep the cost of a module record
        and of an op record. ``shapes`` switches the ops' shapes off and on again when the
        level records them in the first measured iteration only: the step is then timed both
        ways, as the first iteration and the later ones pay. Never raises."""
        if not self._probes:
            return
        kinds = {"ops": (KIND_OP, KIND_RANGE), "modules": (KIND_MODULE,)}
        try:
            with _training():
                for name, probe in self._probes.items():
                    first_only = name == "step" and shapes is not None
                    self._time_on(
                        probe, records, kinds, FIRST_ITERATION_ROUNDS if first_only else ROUNDS
                    )
                if shapes is not None:
                    plain = _Probe(self._probes["step"].work)
                    plain.off = self._probes["step"].off
                    shapes(False)
                    try:
                        self._time_on(plain, records, kinds)
                    finally:
                        shapes(True)  # the first measured iteration records them
                    self._probes["step_without_shapes"] = plain
        except Exception:
            log.exception("xsp: calibration (levels on) failed; host durations keep F's cost")
            return
        modules = self._probes["modules"]
        if modules.records["modules"] <= 0:
            return
        module_ns = modules.cost() / modules.records["modules"]
        with_shapes = self._op_ns(self._probes["step"], module_ns)
        later = self._probes.get("step_without_shapes", self._probes["step"])
        op_ns = self._op_ns(later, module_ns)
        if with_shapes is None or op_ns is None:
            return
        self.result = {
            "framework_ns_per_record": round(op_ns, 1),
            "module_ns_per_call": round(module_ns, 1),
            "probes": {
                name: {
                    "off_ns": round(probe.off or 0.0, 1),
                    "on_ns": round(probe.on or 0.0, 1),
                    "records": probe.records,
                }
                for name, probe in self._probes.items()
            },
            "device": str(self._device),
            "calls": CALLS,
            "rounds": ROUNDS,
        }
        if shapes is not None:
            self.result["framework_ns_per_record_first_iteration"] = round(with_shapes, 1)
            self.result["rounds_first_iteration"] = FIRST_ITERATION_ROUNDS

    def _time_on(
        self,
        probe: _Probe,
        records: Callable[[tuple[int, ...]], int],
        kinds: dict[str, tuple[int, ...]],
        rounds: int = ROUNDS,
    ) -> None:
        probe.work()  # warm, as before
        held = {name: records(k) for name, k in kinds.items()}
        probe.on = _per_call_ns(probe.work, self._settle, rounds)
        calls = rounds * CALLS
        probe.records = {name: (records(k) - held[name]) / calls for name, k in kinds.items()}

    @staticmethod
    def _op_ns(step: _Probe, module_ns: float) -> float | None:
        """An op record's cost: the step's added time less its module calls', per op record."""
        if step.records.get("ops", 0) <= 0:
            return None
        return max(0.0, step.cost() - module_ns * step.records["modules"]) / step.records["ops"]
