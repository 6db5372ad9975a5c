"""A ``torch.compile``d torchvision ResNet-18 training loop (random weights and data, SGD),
unmodified by xsp: the "compiled ResNet-18 script" of the run-cost issue (issue 31).

    python benchmarks/workloads/compiled_resnet18.py --steps 30 --batch-size 32
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/r18c -- \
        python benchmarks/workloads/compiled_resnet18.py --steps 30 --batch-size 32

On CPU a small batch and image (``--batch-size 2 --image 64``) keeps the compile to tens of
seconds. It prints how long its first step (the compile) and the later steps took.
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image", type=int, default=224)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.compile(torchvision.models.resnet18().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.randn(args.batch_size, 3, args.image, args.image, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    started = time.perf_counter()
    first = 0.0
    for step in range(args.steps):
        loss_fn(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            if device == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - started
    if device == "cuda":
        torch.cuda.synchronize()
    rest = time.perf_counter() - started - first
    print(f"compiled_resnet18: first step {first:.2f} s, {args.steps - 1} more in {rest:.2f} s")


if __name__ == "__main__":
    main()
