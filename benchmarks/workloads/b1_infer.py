"""Batch-1 inference of a torchvision model (random weights, one random image), unmodified by
xsp: ``model(x)`` in a loop under ``torch.inference_mode``, the latency-bound case where the
host's launch overhead shows. ResNet-50 at 224x224 on CUDA, ResNet-18 at 64x64 on CPU.

    python benchmarks/workloads/b1_infer.py --steps 40
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/b1 -- \
        python benchmarks/workloads/b1_infer.py --steps 40

Its iterations are the root module's calls (one forward pass each). It prints its own median
step time over the steps after the first 5 (CUDA events around each forward pass on CUDA,
``time.perf_counter`` on CPU) to compare with xsp's M run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default="resnet50" if cuda else "resnet18")
    parser.add_argument("--image-size", type=int, default=224 if cuda else 64)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).to(device).eval()
    image = torch.randn(1, 3, args.image_size, args.image_size, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(args.steps):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            if cuda:
                start.record()
            started = time.perf_counter()
            model(image)
            if cuda:
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                times.append((time.perf_counter() - started) * 1e3)
    print(f"b1_infer: median step {statistics.median(times[5:] or times):.3f} ms")


if __name__ == "__main__":
    main()
