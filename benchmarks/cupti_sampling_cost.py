"""What each way of sampling levels L and G in a service costs: the unsampled requests (CUPTI
left as it is between sampled requests) and one sampled request's cycle (CUPTI switched on, the
request, switched off, its records collected).

Each way runs in a fresh process (CUPTI cannot be un-initialized except by finalizing it), with
the environment ``xsp run`` gives a level-set process with L (the libraries' NVTX ranges routed
into CUPTI). A request is a batch-1 MLP's forward pass and a device sync, timed around both.
In each process: ``--requests`` requests untraced; recording; with CUPTI switched off as the
way leaves it (the unsampled requests); ``--cycles`` sampled cycles, each after 20 unsampled
requests; the unsampled requests again; finalized. The ways:

    finalize          today's: CUPTI started (L and G's kinds) for each sampled request and
                      finalized after it
    pause-activity    Kineto's: CUPTI kept, L and G's kinds enabled around each sampled request,
                      flushed and disabled after it
    pause-callbacks   xsp's continuous sessions: CUPTI kept, G's and L's other kinds enabled
                      around each sampled request, the API calls recorded from the
                      subscriber's callbacks, whose runtime and driver domains are switched off
                      between
    g, runtime, driver, marker, synchronization, cuda-event, external, callbacks
                      one kind (or the API callbacks alone) paused the same way: which of them
                      costs the unsampled requests

    python benchmarks/cupti_sampling_cost.py [--ways finalize,pause-activity,...]
        [--requests 2000] [--cycles 30] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIBRARY = ["RUNTIME", "DRIVER", "MARKER", "SYNCHRONIZATION", "CUDA_EVENT", "EXTERNAL_CORRELATION"]
GPU = ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET"]
#: way -> (kinds, API calls from callbacks)
WAYS: dict[str, tuple[list[str], bool]] = {
    "finalize": (LIBRARY + GPU, False),
    "pause-activity": (LIBRARY + GPU, False),
    "pause-callbacks": (LIBRARY + GPU, True),
    "g": (GPU, False),
    "runtime": (["RUNTIME"], False),
    "driver": (["DRIVER"], False),
    "marker": (["MARKER"], False),
    "synchronization": (["SYNCHRONIZATION"], False),
    "cuda-event": (["CUDA_EVENT"], False),
    "external": (["RUNTIME", "EXTERNAL_CORRELATION"], False),
    "callbacks": (["RUNTIME", "DRIVER"], True),
}


def one_way(way: str, requests: int, cycles: int, width: int) -> dict[str, Any]:
    import torch

    from xsp.tracer.capture.cupti import QUIET_API_CALLS
    from xsp.tracer.native.build import load

    kinds, callbacks = WAYS[way]
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda().eval()
    x = torch.randn(1, width, device="cuda")
    native = load()
    quiet = sorted(QUIET_API_CALLS)
    out: dict[str, Any] = {"way": way}

    def request() -> int:
        begin = time.perf_counter_ns()
        net(x)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - begin

    def measure(state: str) -> None:
        for _ in range(200):
            request()
        times = [request() for _ in range(requests)]
        out[state] = {
            "p50_us": statistics.median(times) / 1e3,
            "mean_us": statistics.fmean(times) / 1e3,
        }

    def start() -> None:
        native.cupti_start(kinds, 16 << 20, 4, quiet, api_callbacks=callbacks)

    def off() -> None:
        if way == "finalize":
            native.cupti_stop()
            native.cupti_collect(0, True)
            native.cupti_finalize()
        else:
            native.cupti_pause()
            native.cupti_collect(0, False)

    with torch.inference_mode():
        measure("untraced")
        start()
        measure("recording")
        off()
        measure("off")
        phases: dict[str, list[float]] = {p: [] for p in ("on", "request", "off", "cycle")}
        between: list[int] = []
        for _ in range(cycles):
            between += [request() for _ in range(20)]
            stamps = [time.perf_counter_ns()]
            if way == "finalize":
                start()
            else:
                native.cupti_resume()
            stamps.append(time.perf_counter_ns())
            request()
            stamps.append(time.perf_counter_ns())
            off()
            stamps.append(time.perf_counter_ns())
            for phase, begin, end in zip(phases, stamps, stamps[1:], strict=False):
                phases[phase].append((end - begin) / 1e3)
            phases["cycle"].append((stamps[-1] - stamps[0]) / 1e3)
        for phase, times in phases.items():
            out[f"cycle {phase}"] = {"p50_us": statistics.median(times), "max_us": max(times)}
        out["between cycles"] = {
            "p50_us": statistics.median(between) / 1e3,
            "mean_us": statistics.fmean(between) / 1e3,
        }
        decoded = native.cupti_decode(0)
        gpu_corr = set(memoryview(decoded["gpu"]["correlation"]).cast("q").tolist())
        api_corr = set(memoryview(decoded["api"]["correlation"]).cast("q").tolist())
        out["kernels"] = len(gpu_corr)
        out["api_calls"] = len(api_corr)
        out["kernels_with_launch"] = len(gpu_corr & api_corr)
        out["external_ids"] = len(decoded["external"]["correlation"]) // 8
        out["markers"] = len(decoded["markers"]["start_ns"]) // 8
        measure("off after cycles")
        native.cupti_stop()
        native.cupti_finalize()
        measure("finalized")
    base = (out["untraced"]["p50_us"] + out["finalized"]["p50_us"]) / 2
    out["unsampled_added_p50_us"] = out["off"]["p50_us"] - base
    out["unsampled_added_after_cycles_p50_us"] = out["off after cycles"]["p50_us"] - base
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_way(args.one, args.requests, args.cycles, args.width)))
        return
    from xsp.tracer.capture.cupti import nvtx_environment

    env = {**os.environ, **nvtx_environment()}
    results = []
    for way in args.ways.split(","):
        command = [sys.executable, __file__, "--one", way, "--requests", str(args.requests)]
        command += ["--cycles", str(args.cycles), "--width", str(args.width)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            print(f"{way}: failed: {done.stderr[-600:]}", flush=True)
            results.append({"way": way, "error": done.stderr[-600:]})
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(row)
        print(
            f"{way:<16} untraced {row['untraced']['p50_us']:6.1f} recording "
            f"{row['recording']['p50_us']:6.1f} off {row['off']['p50_us']:6.1f} "
            f"(+{row['unsampled_added_p50_us']:5.1f}; after cycles "
            f"+{row['unsampled_added_after_cycles_p50_us']:5.1f}) finalized "
            f"{row['finalized']['p50_us']:6.1f} | cycle {row['cycle cycle']['p50_us']:8.1f} "
            f"(on {row['cycle on']['p50_us']:.1f}, request {row['cycle request']['p50_us']:.1f}, "
            f"off {row['cycle off']['p50_us']:.1f}) | kernels {row['kernels']} with launch "
            f"{row['kernels_with_launch']}, api {row['api_calls']}, external "
            f"{row['external_ids']}, markers {row['markers']}",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
