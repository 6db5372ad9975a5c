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
   repeated, so that only the backward is timed.
4. On a GPU, a batch of calls runs behind a ``torch.cuda._sleep`` long enough for the host to
   queue them all, between two CUDA events: the events then time the GPU's work alone, kernel
   after kernel, not the host's launches (a 10 µs GEMM launched from Python would time its
   launch). The median over ``ROUNDS`` batches, per call. On the CPU, each call is timed on the
   host clock, and the fastest kept: a shared host's other work only ever adds to a call
   (on the 2-core development machine under load, medians of 20 calls of one convolution
   ranged 0.2-26 ms, minima 0.17-0.21 ms). Each measurement stops after about ``budget_ms``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from xsp.core.store.op_timings import CaseTiming, OpCase

__all__ = ["DEFAULT_BUDGET_MS", "FIXES", "time_case"]

#: About how long one measurement (a case's forward or backward, base or fixed) takes.
DEFAULT_BUDGET_MS = 10.0
ROUNDS = 5
MIN_CALLS = 3
MIN_CPU_CALLS = 5
MAX_CALLS_PER_ROUND = 40
#: The longest sleep a GPU batch waits behind (ms): a host slower than that times its launches.
MAX_SLEEP_MS = 100.0
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
    """The case's median forward (and backward) time without and with ``fix``, µs."""
    import torch

    if fix not in FIXES:
        raise ValueError(f"fix {fix!r} cannot be applied to one op: use {', '.join(FIXES)}")
    dev = torch.device(device)
    times: dict[tuple[bool, str], float] = {}
    for fixed in (False, True):
        with _settings(fix, fixed, dev):
            op = _Op(case, fix if fixed else None, dev)
            times[(fixed, "forward")] = _median_us(op.forward, dev, budget_ms)
            if case.backward:
                times[(fixed, "backward")] = _median_us(op.backward(), dev, budget_ms)
            del op
    return CaseTiming(
        key=case.key,
        base_forward_us=times[(False, "forward")],
        fixed_forward_us=times[(True, "forward")],
        base_backward_us=times.get((False, "backward")),
        fixed_backward_us=times.get((True, "backward")),
    )


@contextlib.contextmanager
def _settings(fix: str, fixed: bool, device: Any) -> Iterator[None]:
    """The process-wide switches of ``fix`` (tf32) while the fixed side runs, restored after."""
    import torch

    if fix != "tf32" or not fixed:
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
        torch.set_float32_matmul_precision(precision)


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

    def forward(self) -> Any:
        import torch

        grad = torch.enable_grad() if self.case.backward else torch.no_grad()
        with grad, self._autocast():
            return self.call()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.fix != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def backward(self) -> Callable[[], Any]:
        """A call that runs the op's backward once more on one kept forward graph."""
        import torch

        out = self.forward()
        grad = torch.randn_like(out)  # NHWC where the fixed output is (preserve_format)
        wanted = [t for t in self.inputs if t is not None and t.requires_grad]

        def backward() -> Any:
            return torch.autograd.grad(out, wanted, grad, retain_graph=True)

        return backward


def _median_us(call: Callable[[], Any], device: Any, budget_ms: float) -> float:
    return _gpu_us(call, budget_ms) if device.type == "cuda" else _cpu_us(call, budget_ms)


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


def _gpu_us(call: Callable[[], Any], budget_ms: float) -> float:
    import torch

    call()  # cuDNN's plan, the allocator's blocks
    torch.cuda.synchronize()
    begin = time.perf_counter()
    call()
    torch.cuda.synchronize()
    once_s = time.perf_counter() - begin  # bounds both the GPU's time and the host's
    calls = int(budget_ms / 1e3 / ROUNDS / max(once_s, 1e-6))
    calls = max(MIN_CALLS, min(calls, MAX_CALLS_PER_ROUND))
    sleep_ms = min(1.5 * once_s * 1e3 * calls, MAX_SLEEP_MS)
    cycles = int(sleep_ms * _cycles_per_ms())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(ROUNDS):
        torch.cuda._sleep(cycles)  # the GPU waits while the host queues the batch
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(per_call)


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
