"""Ops timed in isolation, without and with a kernel-changing fix, on their recorded shapes: what
``xsp estimate`` measures (``xsp.core.store.op_timings``) for the analysis to replay.

Algorithm notes:

1. Each case (``OpCase``) is rebuilt from its shapes as random tensors on the device: the op
   (``aten::convolution`` with its stride and padding, ``batch_norm`` in training or eval mode,
   the GEMMs), its parameters needing gradients where the step runs its backward (the input
   too, but for the batch the step starts from).
2. The fix applies as it would to the workload (``xsp.tracer.workloads.fixes``): channels_last
   makes every 4-D tensor NHWC (the input, the weight, the gradient coming back), tf32 turns on
   cuBLAS's and cuDNN's TF32 math, bf16 runs the forward under ``torch.autocast``. The base runs
   with the process's defaults, as the measurement did.
3. Forward: the op's call. Backward: ``torch.autograd.grad`` of its output on a kept graph,
   repeated, so that only the backward is timed. The grad mode and autocast are entered once
   around a round of calls (note 7), not per call: a step enters them once, not per op.
4. On a GPU, a batch of calls runs behind a ``torch.cuda._sleep`` long enough for the host to
   queue them all, between two CUDA events: the events then time the GPU's work alone, kernel
   after kernel, not the host's launches (a 10 µs GEMM launched from Python would time its
   launch). The median over ``ROUNDS`` batches, per call.
5. On a GPU the host's side is timed too, as a step pays it: the same batches issued back to
   back with no sleep in front, timed on the host clock from the first call to the last one's
   return (the sync between batches is not timed); the median over ``ROUNDS`` batches, per
   call. A fix changes more than kernels: cuBLAS's TF32 path picks its kernel by other
   heuristics and can launch fewer (no split-K reduction), and a host-bound step moves by that
   alone (BERT b1 inference on the H100: its GEMMs' kernels 2-3x faster, the replayed step,
   kernels scaled, unchanged).
6. The kernels one call launches, without and with the fix (``count_kernels``): a few calls
   under ``torch.profiler`` (CUDA activities), after every timing, since the profiler's CUPTI
   hooks could stay behind and slow the calls timed after them. On the CPU, each call is
   timed on the
   host clock, and the fastest kept: a shared host's other work only ever adds to a call
   (on the 2-core development machine under load, medians of 20 calls of one convolution
   ranged 0.2-26 ms, minima 0.17-0.21 ms). Each measurement stops after about ``budget_ms``.
7. On a GPU the two sides are timed in alternating rounds, each side first in every other
   round, both built before the first, so that a drift of the process (its clocks, caches,
   the allocator's state) falls on both sides alike rather than on the one timed first.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from xsp.core.store.op_timings import CaseTiming, OpCase

__all__ = ["DEFAULT_BUDGET_MS", "FIXES", "KernelCounts", "count_kernels", "time_case"]

#: About how long one measurement (a case's forward or backward, base or fixed) takes.
DEFAULT_BUDGET_MS = 10.0
#: Rounds a side is timed in on a GPU: even, so that each side goes first as often (note 7).
ROUNDS = 6
MIN_CALLS = 3
MIN_CPU_CALLS = 5
MAX_CALLS_PER_ROUND = 40
#: The longest sleep a GPU batch waits behind (ms): a host slower than that times its launches.
MAX_SLEEP_MS = 100.0
#: The calls ``count_kernels`` profiles (their kernels divided by it).
PROFILED_CALLS = 3
#: The fixes this module applies to one op.
FIXES = ("channels_last", "tf32", "bf16")
_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
}


def time_case(
    case: OpCase, fix: str, device: str, budget_ms: float = DEFAULT_BUDGET_MS
) -> CaseTiming:
    """The case's median forward (and backward) time without and with ``fix``, µs; on a GPU
    its host time per call too (module notes 5 and 7)."""
    import torch

    if fix not in FIXES:
        raise ValueError(f"fix {fix!r} cannot be applied to one op: use {', '.join(FIXES)}")
    dev = torch.device(device)
    ops = {fixed: _Op(case, fix if fixed else None, dev) for fixed in (False, True)}
    parts = ("forward", "backward") if case.backward else ("forward",)
    calls: dict[tuple[bool, str], Callable[[], Any]] = {}
    for fixed, op in ops.items():
        with _running(op, fix):
            calls[(fixed, "forward")] = op.call
            if case.backward:
                calls[(fixed, "backward")] = op.backward()
    times: dict[tuple[bool, str], float] = {}
    host: dict[tuple[bool, str], float] = {}
    for part in parts:
        sides = {fixed: _TimedSide(calls[(fixed, part)], ops[fixed], fix) for fixed in ops}
        if dev.type != "cuda":
            for fixed, side in sides.items():
                with side.running():
                    times[(fixed, part)] = _cpu_us(side.call, budget_ms)
            continue
        for fixed, (gpu_us, host_us) in _gpu_us(sides, budget_ms).items():
            times[(fixed, part)], host[(fixed, part)] = gpu_us, host_us
    del ops, calls
    return CaseTiming(
        key=case.key,
        base_forward_us=times[(False, "forward")],
        fixed_forward_us=times[(True, "forward")],
        base_backward_us=times.get((False, "backward")),
        fixed_backward_us=times.get((True, "backward")),
        base_host_us=host.get((False, "forward")),
        fixed_host_us=host.get((True, "forward")),
        base_backward_host_us=host.get((False, "backward")),
        fixed_backward_host_us=host.get((True, "backward")),
    )


@dataclass(frozen=True)
class _TimedSide:
    """One side of a comparison: the call timed, and the op whose switches it runs under."""

    call: Callable[[], Any]
    op: _Op
    fix: str

    def running(self) -> contextlib.AbstractContextManager[None]:
        return _running(self.op, self.fix)


@dataclass(frozen=True)
class KernelCounts:
    """The GPU activities (kernels, memsets, copies) one call launches, without (``base``) and
    with (``fixed``) the fix, forward and, where the step runs it, backward."""

    base: int
    fixed: int
    base_backward: int | None = None
    fixed_backward: int | None = None


def count_kernels(case: OpCase, fix: str, device: str) -> KernelCounts | None:
    """The kernels one call of ``case`` launches without and with ``fix`` (module note 6);
    None off a GPU, or where the profiler gives no activities. Call it after every timing."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    counts: dict[tuple[bool, str], int] = {}
    try:
        for fixed in (False, True):
            op = _Op(case, fix if fixed else None, dev)
            with _running(op, fix):
                counts[(fixed, "forward")] = _kernels(op.call)
                if case.backward:
                    counts[(fixed, "backward")] = _kernels(op.backward())
            del op
    except RuntimeError:  # no CUPTI for the profiler: the counts are a detail, the times not
        return None
    if counts[(False, "forward")] <= 0:
        return None
    return KernelCounts(
        base=counts[(False, "forward")],
        fixed=counts[(True, "forward")],
        base_backward=counts.get((False, "backward")),
        fixed_backward=counts.get((True, "backward")),
    )


def _kernels(call: Callable[[], Any]) -> int:
    """The GPU activities per call of ``PROFILED_CALLS`` calls under the profiler, warmed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_CALLS):
            call()
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return round(len(gpu) / PROFILED_CALLS)


@contextlib.contextmanager
def _running(op: _Op, fix: str) -> Iterator[None]:
    """The switches and the grad/autocast mode ``op``'s side runs under."""
    from xsp.tracer.workloads.fixes import FixContext, switched

    switches = switched(fix, FixContext(str(op.device))) if op.fix else contextlib.nullcontext()
    with switches, op.mode():
        yield


class _Op:
    """One case's op on random tensors, with ``fix`` applied (None: the base)."""

    def __init__(self, case: OpCase, fix: str | None, device: Any) -> None:
        self.case, self.fix, self.device = case, fix, device
        data = 1 if case.op in ("aten::addmm", "aten::baddbmm") else 0
        stats = (3, 4) if case.op == "aten::batch_norm" else ()
        self.inputs: list[Any] = []
        for i, shape in enumerate(case.shapes):
            tensor = self._tensor(shape, case.dtypes[i] if i < len(case.dtypes) else "")
            if tensor is not None and i in stats:
                tensor = tensor.abs() + 1.0 if i == 4 else tensor  # a variance is positive
            elif tensor is not None and case.backward and (i != data or case.input_grad):
                tensor.requires_grad_(True)
            self.inputs.append(tensor)
        self.call = self._call()

    def _tensor(self, shape: list[int], dtype: str) -> Any:
        """A random tensor of a recorded input (None: not a tensor, or not a float)."""
        import torch

        name = _DTYPES.get(dtype)
        if name is None or not shape:
            return None
        tensor = torch.randn(shape, dtype=getattr(torch, name), device=self.device)
        if self.fix == "channels_last" and tensor.dim() == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    def _call(self) -> Callable[[], Any]:
        import torch

        case, x = self.case, self.inputs
        if case.op == "aten::convolution":
            spatial = len(case.shapes[0]) - 2
            bias = x[2] if len(x) > 2 else None

            def conv() -> Any:
                return torch.ops.aten.convolution(
                    x[0], x[1], bias, case.stride, case.padding, case.dilation, False,
                    [0] * spatial, case.groups,
                )  # fmt: skip

            return conv
        if case.op == "aten::batch_norm":
            get = lambda i: x[i] if len(x) > i else None  # noqa: E731

            def norm() -> Any:
                return torch.nn.functional.batch_norm(
                    x[0], get(3), get(4), get(1), get(2), training=case.training
                )

            return norm
        calls: dict[str, Callable[[], Any]] = {
            "aten::addmm": lambda: torch.addmm(x[0], x[1], x[2]),
            "aten::mm": lambda: torch.mm(x[0], x[1]),
            "aten::bmm": lambda: torch.bmm(x[0], x[1]),
            "aten::baddbmm": lambda: torch.baddbmm(x[0], x[1], x[2]),
        }
        if case.op not in calls:
            raise ValueError(f"no isolated call for {case.op}")
        return calls[case.op]

    @contextlib.contextmanager
    def mode(self) -> Iterator[None]:
        """The grad mode the step runs the op in, and the fix's autocast: entered once around
        a round of calls (module note 3)."""
        import torch

        grad = torch.enable_grad() if self.case.backward else torch.no_grad()
        autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.fix == "bf16":
            autocast = torch.autocast(self.device.type, dtype=torch.bfloat16)
        with grad, autocast:
            yield

    def backward(self) -> Callable[[], Any]:
        """A call that runs the op's backward once more on one kept forward graph (call it
        under ``mode``)."""
        import torch

        out = self.call()
        grad = torch.randn_like(out)  # NHWC where the fixed output is (preserve_format)
        wanted = [t for t in self.inputs if t is not None and t.requires_grad]

        def backward() -> Any:
            return torch.autograd.grad(out, wanted, grad, retain_graph=True)

        return backward


def _cpu_us(call: Callable[[], Any], budget_ms: float) -> float:
    call()  # first calls pick oneDNN's primitives
    call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_ms / 1e3
    while len(times) < MIN_CPU_CALLS or (time.perf_counter() < deadline and len(times) < 1000):
        begin = time.perf_counter()
        call()
        times.append((time.perf_counter() - begin) * 1e6)
    return min(times)


def _gpu_us(sides: dict[bool, _TimedSide], budget_ms: float) -> dict[bool, tuple[float, float]]:
    """Each side's (GPU median time per call, host's), µs, their rounds alternating and each
    side going first in every other round (module notes 4, 5 and 7)."""
    import torch

    once_s = 0.0
    for side in sides.values():
        with side.running():
            side.call()  # cuDNN's plan, the allocator's blocks
            torch.cuda.synchronize()
            begin = time.perf_counter()
            side.call()
            torch.cuda.synchronize()
            once_s = max(once_s, time.perf_counter() - begin)  # bounds the GPU's and the host's
    calls = int(budget_ms / 1e3 / ROUNDS / max(once_s, 1e-6))
    calls = max(MIN_CALLS, min(calls, MAX_CALLS_PER_ROUND))
    sleep_ms = min(1.5 * once_s * 1e3 * calls, MAX_SLEEP_MS)
    cycles = int(sleep_ms * _cycles_per_ms())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu: dict[bool, list[float]] = {fixed: [] for fixed in sides}
    host: dict[bool, list[float]] = {fixed: [] for fixed in sides}
    for round_ in range(ROUNDS):
        for fixed in sorted(sides, reverse=round_ % 2 == 1):
            with sides[fixed].running():
                call = sides[fixed].call
                torch.cuda._sleep(cycles)  # the GPU waits while the host queues the batch
                start.record()
                for _ in range(calls):
                    call()
                end.record()
                end.synchronize()
                gpu[fixed].append(start.elapsed_time(end) * 1e3 / calls)
                host[fixed].append(_host_us(call, calls))
    return {
        fixed: (statistics.median(gpu[fixed]), statistics.median(host[fixed])) for fixed in sides
    }


def _host_us(call: Callable[[], Any], calls: int) -> float:
    """The host's time per call over a batch of ``calls`` calls issued back to back, from an
    idle GPU (module note 5)."""
    import torch

    torch.cuda.synchronize()  # before the batch, untimed
    begin = time.perf_counter()
    for _ in range(calls):
        call()
    per_call = (time.perf_counter() - begin) * 1e6 / calls
    torch.cuda.synchronize()
    return per_call


_CYCLES_PER_MS: list[float] = []


def _cycles_per_ms() -> float:
    """``torch.cuda._sleep``'s cycles per ms on this GPU, timed once."""
    import torch

    if not _CYCLES_PER_MS:
        cycles = 10_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS.append(cycles / max(start.elapsed_time(end), 1e-3))
    return _CYCLES_PER_MS[0]
