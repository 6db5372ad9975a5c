"""A small training loop as people write it (random weights, random data), unmodified by xsp:
each step makes its batch on the host, pins it (on CUDA) and copies it with
``non_blocking=True``, runs an MLP classifier forward and backward, clips the gradients
(``clip_grad_norm_``), steps AdamW and reads ``loss.item()`` for a running loss it logs every
``--log-every`` steps: a host-device sync every step.

    python benchmarks/workloads/item_loop_train.py --steps 40
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/item -- \
        python benchmarks/workloads/item_loop_train.py --steps 40

It prints its own median step time over the steps after the first 5 (CUDA events around each
step on CUDA, ``time.perf_counter`` on CPU) to compare with xsp's M run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=512 if cuda else 32)
    parser.add_argument("--features", type=int, default=1024 if cuda else 64)
    parser.add_argument("--hidden", type=int, default=4096 if cuda else 128)
    parser.add_argument("--layers", type=int, default=4 if cuda else 2)
    parser.add_argument("--classes", type=int, default=1000 if cuda else 10)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width = args.features
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.ReLU()]
        width = args.hidden
    model = nn.Sequential(*layers, nn.Linear(width, args.classes)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    running, times = 0.0, []
    for step in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        if cuda:
            start.record()
        started = time.perf_counter()
        inputs = torch.randn(args.batch_size, args.features)
        targets = torch.randint(0, args.classes, (args.batch_size,))
        if cuda:
            inputs, targets = inputs.pin_memory(), targets.pin_memory()
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        running = 0.9 * running + 0.1 * loss.item() if step else loss.item()
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1}: running loss {running:.4f}")
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            times.append((time.perf_counter() - started) * 1e3)
    print(f"item_loop_train: median step {statistics.median(times[5:] or times):.3f} ms")


if __name__ == "__main__":
    main()
