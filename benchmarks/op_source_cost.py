"""What recording each op's calling Python line costs level F, in one process (CPU).

Times a small model's forward and backward with level F's op callback on and the ops' shapes
recorded (as in the first measured iteration of the deepest level set with F), with the lines
recorded and without, in interleaved rounds (the host drifts), and prints the cost per op.

    python benchmarks/op_source_cost.py [--rounds 7] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from xsp.tracer.native.build import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    native = load()
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8)))
    x = torch.randn(16, 64)

    def step() -> None:
        model(x).sum().backward()

    def timed() -> float:
        begin = time.perf_counter_ns()
        for _ in range(args.calls):
            step()
        return (time.perf_counter_ns() - begin) / args.calls

    with tempfile.TemporaryDirectory() as work:
        arena = Path(work) / "capture.arena"
        native.arena_open(str(arena), 1 << 30)
        native.ops_start(True)
        kinds = {"with lines": True, "without": False}
        per_step: dict[str, list[float]] = {k: [] for k in kinds}
        step()
        for _ in range(args.rounds):
            for name, on in kinds.items():
                native.ops_sources(on)
                per_step[name].append(timed())
        native.ops_stop()
        native.arena_close()
    native.ops_sources(True)
    ops = _ops_per_step(step)
    with_ns = statistics.median(per_step["with lines"])
    without_ns = statistics.median(per_step["without"])
    print(f"ops per step: {ops} (forward and backward; backward on the calling thread on CPU)")
    print(f"step with lines:    {with_ns / 1e3:9.1f} µs (median of {args.rounds} rounds)")
    print(f"step without lines: {without_ns / 1e3:9.1f} µs")
    print(
        f"lines cost: {(with_ns - without_ns) / ops:.0f} ns per op, "
        f"{100 * (with_ns - without_ns) / without_ns:.1f}% of the step with shapes"
    )


def _ops_per_step(step: object) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()  # type: ignore[operator]
    return len(prof.events())


if __name__ == "__main__":
    main()
