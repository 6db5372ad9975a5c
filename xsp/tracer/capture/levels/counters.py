"""Level H: hardware counters, read by Nsight Compute (``ncu``) replaying every kernel of the
measured iterations. The level-set process runs under ``ncu --profile-from-start off``
(``xsp.tracer.run.ncu``); this level only tells ncu what to profile and how it is labelled:

1. each measured iteration opens the profiler (``cudaProfilerStart``) and an NVTX start/end
   range ``xsp::step::N``, and closes both when it ends, so ncu replays the measured kernels and
   nothing else (neither warm-up nor set-up). Start/end ranges, unlike push/pop ranges, are
   process-wide: the backward kernels that autograd's device thread launches fall inside them;
2. ``enable()`` first measures attainable peaks on the device (outside the profiled window, so
   at full speed): large GEMMs per precision and a device copy, timed with CUDA events. The
   analyses set kernels against these roofs, or against the datasheet table where one is
   missing (``xsp.analysis.tables.peaks``), and say which.

The level records no spans: its counter values come from ncu's report after the process exits.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from xsp.core.records import STEP_RANGE_PREFIX
from xsp.core.run_sections import RunCounts

if TYPE_CHECKING:
    from xsp.tracer.capture.levels import LevelContext

__all__ = [
    "CALIBRATION_REPEATS",
    "COPY_BYTES",
    "GEMM_SHAPES",
    "CounterLevel",
    "build",
    "measure_peaks",
]

log = logging.getLogger(__name__)

#: Calibration shapes (M, N, K): multiples of every tensor-core tile, so no padding is counted.
GEMM_SHAPES: dict[str, tuple[int, int, int]] = {
    "fp64_tensor": (4096, 4096, 4096),
    "fp32": (4096, 4096, 4096),
    "tf32_tensor": (8192, 8192, 8192),
    "fp16_tensor": (8192, 8192, 8192),
    "bf16_tensor": (8192, 8192, 8192),
}
#: Bytes the copy kernel reads (and writes): far beyond the 50 MB L2, so DRAM serves them.
COPY_BYTES = 2 << 30
CALIBRATION_REPEATS = 5


class CounterLevel:
    letter = "H"

    def __init__(self, device: str, calibrate: bool = True) -> None:
        self._device = device
        self._calibrate = calibrate
        self._ranges: dict[int, int] = {}
        self._iterations = 0
        self._peaks: dict[str, float] = {}
        self._errors: list[str] = []
        self._calibration_s = 0.0

    def enable(self) -> None:
        if self._calibrate:
            started = time.perf_counter()
            try:
                self._peaks = measure_peaks(self._device)
            except Exception as exc:  # the datasheet table serves instead; run.json says why
                self._errors.append(f"peak calibration failed: {type(exc).__name__}: {exc}")
                log.warning("xsp: %s", self._errors[-1])
            self._calibration_s = time.perf_counter() - started

    def begin_iteration(self, index: int) -> None:
        import torch

        torch.cuda.profiler.start()
        self._ranges[index] = torch.cuda.nvtx.range_start(f"{STEP_RANGE_PREFIX}{index}")

    def end_iteration(self, index: int) -> None:
        import torch

        handle = self._ranges.pop(index, None)
        if handle is not None:
            torch.cuda.nvtx.range_end(handle)
            self._iterations += 1
        torch.cuda.profiler.stop()

    def disable(self) -> None:
        import torch

        for handle in self._ranges.values():  # an iteration that never ended (the run failed)
            torch.cuda.nvtx.range_end(handle)
        if self._ranges:
            torch.cuda.profiler.stop()
        self._ranges.clear()

    def drain(self) -> None:
        return None

    def counts(self) -> RunCounts:
        """What run.json keeps of this level: the iterations it labelled, the peaks it measured
        (FLOP/s per roof, DRAM bytes/s) and any calibration failure."""
        return {
            "counters": {
                "iterations_profiled": self._iterations,
                "peaks_measured": dict(self._peaks),
                "peaks_method": (
                    "best of {n} CUDA-event-timed runs each: GEMMs {shapes} (2·M·N·K FLOPs) and "
                    "an elementwise device copy of {copy} GiB (bytes read plus written), before "
                    "the profiled window"
                ).format(
                    n=CALIBRATION_REPEATS,
                    shapes=", ".join(
                        f"{k} {'x'.join(map(str, v))}" for k, v in GEMM_SHAPES.items()
                    ),
                    copy=COPY_BYTES >> 30,
                ),
                "calibration_s": round(self._calibration_s, 3),
                "errors": list(self._errors),
            }
        }


def measure_peaks(device: str) -> dict[str, float]:
    """Attainable peaks on ``device``: FLOP/s of a large GEMM per roof (``fp32`` on CUDA cores,
    ``*_tensor`` on tensor cores) and DRAM bytes/s (``dram``) of an elementwise copy, each the
    best of ``CALIBRATION_REPEATS`` CUDA-event-timed runs after two untimed ones."""
    import torch

    dtypes = {
        "fp64_tensor": torch.float64,
        "fp32": torch.float32,
        "tf32_tensor": torch.float32,
        "fp16_tensor": torch.float16,
        "bf16_tensor": torch.bfloat16,
    }
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    peaks: dict[str, float] = {}
    try:
        for roof, (m, n, k) in GEMM_SHAPES.items():
            matmul.allow_tf32 = roof == "tf32_tensor"
            a = torch.randn(m, k, device=device, dtype=dtypes[roof])
            b = torch.randn(k, n, device=device, dtype=dtypes[roof])
            out = torch.empty(m, n, device=device, dtype=dtypes[roof])
            seconds = _best_seconds(lambda a=a, b=b, out=out: torch.mm(a, b, out=out))
            peaks[roof] = 2.0 * m * n * k / seconds
            del a, b, out
        source = torch.empty(COPY_BYTES // 4, device=device, dtype=torch.float32)
        target = torch.empty_like(source)
        seconds = _best_seconds(lambda s=source, t=target: torch.mul(s, 1.0, out=t))
        peaks["dram"] = 2.0 * COPY_BYTES / seconds
        del source, target
    finally:
        matmul.allow_tf32 = saved
        torch.cuda.empty_cache()
    return peaks


def _best_seconds(work: Any) -> float:
    import torch

    for _ in range(2):
        work()
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def build(ctx: LevelContext) -> CounterLevel:
    """Level H of a session, under Nsight Compute (its row in ``xsp.core.levels`` names this
    factory)."""
    return CounterLevel(ctx.device)
