"""A workload whose layers' GPU times are known: 8 layers, each a module that keeps the GPU
busy for a set time (``torch.cuda._sleep``), 0.03 to 2.03 ms, with a little host work between
them (small ops), as an inference loop marked with ``xsp.step()``.

    python benchmarks/workloads/known_layers.py --truth truth.json      # CUDA-event truth
    xsp run --levels M,MF,MFLG --iterations 20 --warmup 5 --device cuda --out runs/known -- \
        python benchmarks/workloads/known_layers.py --steps 50

``--truth`` times every layer and the step with CUDA events, untraced, and writes their medians:
the figures the replay's layer GPU times and step are checked against.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import xsp

#: Each layer's GPU time in ms: layer 2 is the slowest (2.03 ms).
LAYER_MS = (0.03, 0.25, 2.03, 0.5, 1.0, 0.08, 1.5, 0.3)


class Busy(torch.nn.Module):
    """Spins the GPU for about ``ms`` (calibrated cycles), then a small elementwise op."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return x * 1.0001


def cycles_per_ms() -> float:
    """How many ``_sleep`` cycles take a millisecond on this GPU (CUDA events)."""
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    torch.cuda._sleep(1_000_000)  # warm the clock
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--truth", help="write the CUDA-event truth (JSON) here and exit")
    args = parser.parse_args()
    rate = cycles_per_ms()
    model = torch.nn.Sequential(*(Busy(int(ms * rate)) for ms in LAYER_MS)).cuda()
    x = torch.ones(64, device="cuda")
    if args.truth:
        layers: list[list[float]] = [[] for _ in LAYER_MS]
        steps = []
        for _ in range(args.steps):
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(LAYER_MS) + 1)]
            marks[0].record()
            y = x
            for i, layer in enumerate(model):
                y = layer(y)
                marks[i + 1].record()
            marks[-1].synchronize()
            for i in range(len(LAYER_MS)):
                layers[i].append(marks[i].elapsed_time(marks[i + 1]))
            steps.append(marks[0].elapsed_time(marks[-1]))
        half = args.steps // 2  # the second half: warm
        truth = {
            "layer_ms": [statistics.median(v[half:]) for v in layers],
            "step_ms": statistics.median(steps[half:]),
            "cycles_per_ms": rate,
        }
        with open(args.truth, "w") as out:
            json.dump(truth, out, indent=1)
        print(json.dumps(truth))
        return
    for _ in range(args.steps):
        xsp.step()
        model(x)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
