"""What CUPTI costs a batch-1 inference request while it stays attached to the process with its
kinds disabled, against the same request untraced and after CUPTI was finalized; and what a
sampled request costs when CUPTI is started for it and finalized after it (a continuous
session's levels L and G: ``xsp.tracer.capture.hooks.cupti``'s ``suspend``).

One process, the states in order (CUPTI cannot be un-initialized except by finalizing it), each
state ``--requests`` requests (an MLP's forward pass and a device sync, timed around the call);
then ``--cycles`` sampled requests, each with CUPTI started before it, stopped, decoded and
finalized after it, 20 unsampled requests apart:

    python benchmarks/cupti_attach_cost.py [--width 2048] [--requests 2000] [--cycles 30]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from xsp.tracer.capture.hooks.cupti import QUIET_API_CALLS
from xsp.tracer.capture.levels.cuda import GpuLevel, LibraryLevel
from xsp.tracer.native.build import load

LIBRARY = [*LibraryLevel.kinds, "EXTERNAL_CORRELATION"]
GPU = list(GpuLevel.kinds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).cuda().eval()
    x = torch.randn(1, args.width, device="cuda")
    native = load()
    quiet = sorted(QUIET_API_CALLS)
    results: dict[str, float] = {}

    def measure(state: str) -> None:
        times = []
        with torch.inference_mode():
            for _ in range(200):
                net(x)
            torch.cuda.synchronize()
            for _ in range(args.requests):
                begin = time.perf_counter_ns()
                net(x)
                torch.cuda.synchronize()
                times.append(time.perf_counter_ns() - begin)
        results[state] = statistics.median(times) / 1e3
        print(f"{state:<44} p50 {results[state]:8.1f} µs", flush=True)

    measure("untraced, before CUPTI")
    for name, kinds in (("L", LIBRARY), ("G", GPU), ("LG", LIBRARY + GPU)):
        native.cupti_start(kinds, 16 << 20, 4, quiet)
        native.cupti_measuring(True)
        measure(f"{name} recording")
        native.cupti_measuring(False)
        native.cupti_stop()
        native.cupti_decode()
        measure(f"{name} stopped, attached (kinds disabled)")
        native.cupti_finalize()
        measure(f"{name} finalized")
    # CUPTI started for one request and finalized after it, as a sampled request would be
    phases: dict[str, list[float]] = {
        phase: [] for phase in ("start", "request", "stop", "collect", "finalize")
    }
    with torch.inference_mode():
        for _ in range(args.cycles):
            for _ in range(20):  # unsampled requests between
                net(x)
            torch.cuda.synchronize()
            stamps = [time.perf_counter_ns()]
            native.cupti_start(LIBRARY + GPU, 16 << 20, 4, quiet)
            stamps.append(time.perf_counter_ns())
            net(x)
            torch.cuda.synchronize()
            stamps.append(time.perf_counter_ns())
            native.cupti_stop()
            stamps.append(time.perf_counter_ns())
            native.cupti_collect(0, True)
            stamps.append(time.perf_counter_ns())
            native.cupti_finalize()
            stamps.append(time.perf_counter_ns())
            for phase, begin, end in zip(phases, stamps, stamps[1:], strict=False):
                phases[phase].append((end - begin) / 1e3)
    for phase, times in phases.items():
        results[f"cycle {phase} p50_us"] = statistics.median(times)
        print(f"cycle {phase:<38} p50 {statistics.median(times):8.1f} µs, max {max(times):.1f}")
    decoded = native.cupti_decode()  # every cycle's records, collected before each finalize
    kernels = len(decoded["gpu"]["kind"])
    results["kernels decoded"] = kernels
    print(
        f"kernels decoded after {args.cycles} cycles: {kernels}, {kernels / args.cycles:g} a request"
    )
    measure("after the cycles, finalized")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
