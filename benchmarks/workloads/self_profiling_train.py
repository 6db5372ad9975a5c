"""A training script that profiles itself, as many do: ``torch.profiler.profile`` with a schedule
and ``on_trace_ready``, ``prof.step()`` after each optimizer step. Random weights and data.

    python benchmarks/workloads/self_profiling_train.py --steps 20 --counts counts.json
    xsp run --levels M,MF --iterations 5 --warmup 2 -- \
        python benchmarks/workloads/self_profiling_train.py --steps 20 --counts counts.json

``--model mlp`` (default): a few Linear layers; ``--model resnet18``: torchvision's ResNet-18
(random weights, 64x64 images). On CUDA the profiler records CPU and CUDA activities. Each time
the profiler's trace is ready the script counts its events (``key_averages()`` entries' calls,
and its events on the device) and, with ``--counts``, appends them to a file as one JSON line
per process (xsp runs the script in several), so that runs under xsp compare with a run alone.
``--wait``, ``--warmup``, ``--active`` are the profiler's schedule (repeats until the script
ends).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


def _model(name: str, device: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10)
        x = torch.randn(16, 3, 64, 64)
        y = torch.randint(0, 10, (16,))
    else:
        model = nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
        x = torch.randn(32, 64)
        y = torch.randint(0, 10, (32,))
    return model.to(device), x.to(device), y.to(device)


def _count(prof: Any) -> dict[str, int]:
    """What the profiler recorded in its last active window."""
    cpu_ops = sum(e.count for e in prof.key_averages())
    trace = prof.profiler.kineto_results
    device_events = 0
    if trace is not None:
        for event in trace.events():
            if event.device_type() != torch.autograd.DeviceType.CPU:
                device_events += 1
    return {"cpu_op_calls": cpu_ops, "device_events": device_events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", choices=("mlp", "resnet18"), default="mlp")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--wait", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--counts", help="write the profiler's counts (JSON) here")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, x, y = _model(args.model, args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    activities = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    traces: list[dict[str, int]] = []

    def ready(prof: Any) -> None:
        traces.append(_count(prof))

    with profile(
        activities=activities,
        schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(args.steps):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            prof.step()
    final = float(loss.detach().cpu())
    print(f"profiler traces: {traces}; final loss {final:.6f}")
    if args.counts:  # one line per process: xsp runs the script in several
        with open(args.counts, "a") as f:
            f.write(json.dumps({"traces": traces, "final_loss": final}) + "\n")


if __name__ == "__main__":
    main()
