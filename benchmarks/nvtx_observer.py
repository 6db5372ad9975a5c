"""Host cost per op of PyTorch's NVTX observer (level F's op source when L or G runs on CUDA),
with and without op shapes in the range names. Runs anywhere (no GPU, no CUPTI attached): it
measures the observer's own formatting and NVTX calls.

    python benchmarks/nvtx_observer.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.autograd import ProfilerConfig, ProfilerState, _disable_profiler, _enable_profiler

LAYERS = 200  # each Linear runs 3 aten ops (linear, t, addmm)


def _median_ms(model: torch.nn.Module, x: torch.Tensor, repeats: int = 30) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            model(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(LAYERS)])
    x = torch.randn(1, 16)
    base = _median_ms(model, x)
    ops = 3 * LAYERS
    for shapes in (False, True):
        config = ProfilerConfig(
            ProfilerState.NVTX,
            shapes,
            False,
            False,
            False,
            False,
            torch._C._profiler._ExperimentalConfig(),
        )
        _enable_profiler(config, set())
        try:
            ms = _median_ms(model, x)
        finally:
            _disable_profiler()
        print(
            f"NVTX observer, shapes={shapes}: {ms:.3f} ms against {base:.3f} ms untraced, "
            f"{(ms - base) / ops * 1e3:.2f} µs per op"
        )


if __name__ == "__main__":
    main()
