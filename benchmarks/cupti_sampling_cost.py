"""What each way of sampling levels L and G in a service costs: the unsampled requests (CUPTI
left as the way leaves it between sampled requests) and one sampled request's cycle (CUPTI
switched on, the request, switched off, its records collected).

One process, with the environment ``xsp run`` gives a level-set process with L (the
libraries' NVTX ranges routed into CUPTI). A request is a batch-1 MLP's forward pass and a
device sync, timed around both. CUPTI finalized is as good as never started (the first
version of this benchmark measured that in fresh processes: ``benchmarks/results/
gpu-sampling-h100/cupti-sampling-cost-fresh-processes.log``), so each round runs ``--block``
requests untraced, then each way in shuffled order: CUPTI started with its kinds and switched
off as the way leaves it, ``--block`` requests (the unsampled requests), ``--cycles`` sampled
cycles, then CUPTI finalized; and ``--block`` untraced requests again. A way's cost to the
unsampled requests is the median over rounds of its block's median minus the mean of the
round's two untraced medians: the host's drift (tens of µs over tens of seconds) cancels.

    finalize          today's: CUPTI started (L and G's kinds) for each sampled request and
                      finalized after it
    pause-activity    Kineto's: CUPTI kept, L and G's kinds enabled around each sampled request,
                      flushed and disabled after it
    pause-callbacks   CUPTI kept, G's and L's other kinds enabled around each sampled request,
                      the API calls recorded from the subscriber's callbacks, whose runtime and
                      driver domains are switched off between
    ...-nocapture     the same with the stream captures' callbacks off too between
    ...-1mb, -256k    the same with 1 MB or 256 KB activity buffers (else 16 MB)
    pause-lean        xsp's continuous sessions: pause-callbacks-1mb without SYNCHRONIZATION
                      and CUDA_EVENT, and no flush between sampled requests
    g, runtime, driver, marker, synchronization, cuda-event, external, callbacks
                      one kind (or the API callbacks alone) paused the same way: which of them
                      costs the unsampled requests

    python benchmarks/cupti_sampling_cost.py [--ways finalize,pause-activity,...]
        [--rounds 15] [--block 300] [--cycles 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIBRARY = ["RUNTIME", "DRIVER", "MARKER", "SYNCHRONIZATION", "CUDA_EVENT", "EXTERNAL_CORRELATION"]
GPU = ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET"]
MB = 1 << 20
#: way -> (kinds, API calls from callbacks, stream captures' callbacks kept, buffer bytes)
WAYS: dict[str, tuple[list[str], bool, bool, int]] = {
    "finalize": (LIBRARY + GPU, False, True, 16 * MB),
    "pause-activity": (LIBRARY + GPU, False, True, 16 * MB),
    "pause-callbacks": (LIBRARY + GPU, True, True, 16 * MB),
    "pause-callbacks-nocapture": (LIBRARY + GPU, True, False, 16 * MB),
    "pause-callbacks-1mb": (LIBRARY + GPU, True, True, MB),
    "pause-callbacks-256k": (LIBRARY + GPU, True, True, MB // 4),
    "g": (GPU, False, True, 16 * MB),
    "g-nocapture": (GPU, False, False, 16 * MB),
    "runtime": (["RUNTIME"], False, True, 16 * MB),
    "driver": (["DRIVER"], False, True, 16 * MB),
    "marker": (["MARKER"], False, True, 16 * MB),
    "synchronization": (["SYNCHRONIZATION"], False, True, 16 * MB),
    "cuda-event": (["CUDA_EVENT"], False, True, 16 * MB),
    "external": (["RUNTIME", "EXTERNAL_CORRELATION"], False, True, 16 * MB),
    "callbacks": (["RUNTIME", "DRIVER"], True, True, 16 * MB),
    # xsp's continuous sessions: no SYNCHRONIZATION or CUDA_EVENT, 1 MB buffers, and no flush
    # between sampled requests (the records wait in CUPTI's buffer for the batch boundary)
    "pause-lean": (["RUNTIME", "DRIVER", "MARKER", "EXTERNAL_CORRELATION", *GPU], True, True, MB),
}
#: the ways that leave their records in CUPTI's buffer between sampled requests
UNFLUSHED = {"pause-lean"}


def run(ways: list[str], rounds: int, block: int, cycles: int, width: int) -> dict[str, Any]:
    import torch

    from xsp.tracer.capture.hooks.cupti import QUIET_API_CALLS
    from xsp.tracer.native.build import load

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda().eval()
    x = torch.randn(1, width, device="cuda")
    native = load()
    quiet = sorted(QUIET_API_CALLS)

    def request() -> int:
        begin = time.perf_counter_ns()
        net(x)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - begin

    def median_us(n: int) -> float:
        return statistics.median(request() for _ in range(n)) / 1e3

    added: dict[str, list[float]] = {w: [] for w in ways}
    phases: dict[str, dict[str, list[float]]] = {
        w: {p: [] for p in ("on", "request", "off", "cycle")} for w in ways
    }
    untraced: list[float] = []
    rng = random.Random(0)
    with torch.inference_mode():
        for _ in range(200):
            request()
        native.cupti_start(GPU, 16 * MB, 4, quiet)  # the pool's buffers: 16 MB, the largest
        native.cupti_stop()
        native.cupti_finalize()
        for _ in range(rounds):
            order = ways[:]
            rng.shuffle(order)
            before = median_us(block)
            medians = {}
            for way in order:
                kinds, callbacks, captures, size = WAYS[way]
                native.cupti_start(kinds, size, 4, quiet, api_callbacks=callbacks)
                request()
                native.cupti_stop() if way == "finalize" else native.cupti_pause(captures)
                if way == "finalize":
                    native.cupti_finalize()
                for _ in range(20):
                    request()
                medians[way] = median_us(block)
                for _ in range(cycles):
                    stamps = [time.perf_counter_ns()]
                    if way == "finalize":
                        native.cupti_start(kinds, size, 4, quiet)
                    else:
                        native.cupti_resume()
                    stamps.append(time.perf_counter_ns())
                    request()
                    stamps.append(time.perf_counter_ns())
                    if way == "finalize":
                        native.cupti_stop()
                        native.cupti_collect(0, True)
                        native.cupti_finalize()
                    elif way in UNFLUSHED:
                        native.cupti_pause(captures, flush=False)
                    else:
                        native.cupti_pause(captures)
                        native.cupti_collect(0, False)
                    stamps.append(time.perf_counter_ns())
                    for phase, begin, end in zip(phases[way], stamps, stamps[1:], strict=False):
                        phases[way][phase].append((end - begin) / 1e3)
                    phases[way]["cycle"].append((stamps[-1] - stamps[0]) / 1e3)
                native.cupti_stop()
                native.cupti_finalize()
                native.cupti_decode(0)
            after = median_us(block)
            base = (before + after) / 2
            untraced.append(base)
            for way, median in medians.items():
                added[way].append(median - base)
    out: dict[str, Any] = {"untraced_p50_us": statistics.median(untraced), "ways": {}}
    for way in ways:
        row = {
            "unsampled_added_p50_us": statistics.median(added[way]),
            "unsampled_added_min_max_us": [min(added[way]), max(added[way])],
        }
        for phase, times in phases[way].items():
            row[f"cycle_{phase}_p50_us"] = statistics.median(times)
        out["ways"][way] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=300)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from xsp.tracer.capture.hooks.cupti import nvtx_environment

    for key, value in nvtx_environment().items():  # before cuBLAS first calls NVTX
        os.environ.setdefault(key, value)
    out = run(args.ways.split(","), args.rounds, args.block, args.cycles, args.width)
    print(f"untraced p50 {out['untraced_p50_us']:.1f} µs (median over rounds)")
    for way, row in out["ways"].items():
        low, high = row["unsampled_added_min_max_us"]
        print(
            f"{way:<26} unsampled +{row['unsampled_added_p50_us']:6.1f} µs "
            f"[{low:6.1f}, {high:6.1f}] | cycle {row['cycle_cycle_p50_us']:8.1f} µs (on "
            f"{row['cycle_on_p50_us']:.1f}, request {row['cycle_request_p50_us']:.1f}, off "
            f"{row['cycle_off_p50_us']:.1f})",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
