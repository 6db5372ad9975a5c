"""Per-iteration overhead of levels M and MF against the uninstrumented step, with
torch.profiler (CPU activity only) measured in the same process for comparison.

Method: for each case, ROUNDS rounds; in each round every configuration runs WARMUP untimed and
ITERS timed iterations, in a freshly shuffled order (the machine is noisy, so configurations are
interleaved and repeated). Every configuration times an iteration the same way M does: device
synchronization, then the wall clock, at both ends. A configuration's figure in a round is its
median iteration; its ratio is that median over the uninstrumented median of the same round. We
report the median ratio across rounds with its min-max spread.

    python benchmarks/overhead.py [--device cuda] [--rounds 5] [--iters 20] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracer import zoo
from tracer.session import Session
from tracer.sinks import InMemorySink

CASES = [
    ("torchvision:resnet50", "train", 64),
    ("torchvision:resnet50", "infer", 1),
    ("torchvision:mobilenet_v2", "infer", 1),
]
CONFIGS = (
    "none",
    "M",
    "M(no monitor)",
    "MF",
    "MF(no op shapes)",
    "MLG",
    "torch.profiler(cpu)",
    "torch.profiler(cpu,shapes)",
    "torch.profiler(cpu+cuda)",
)


def _timed(step: Any, sync: Any, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        sync()
        t0 = time.time_ns()
        step()
        sync()
        times.append((time.time_ns() - t0) / 1e6)
    return times


def run_config(
    config: str, workload: zoo.Workload, device: str, warmup: int, iters: int
) -> tuple[list[float], int]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if config == "none":
        _timed(workload.step, sync, warmup)
        return _timed(workload.step, sync, iters), 0
    if config.startswith("torch.profiler"):
        _timed(workload.step, sync, warmup)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if "cuda" in config:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(
            activities=activities, record_shapes="shapes" in config
        ) as prof:
            times = _timed(workload.step, sync, iters)
        return times, len(prof.profiler.kineto_results.events())
    sink = InMemorySink()
    levels, _, variant = config.partition("(")
    session = Session(
        levels,
        iterations=iters,
        warmup=warmup,
        sinks=[sink],
        device=device,
        op_shapes="no op shapes" not in variant,
        monitor="no monitor" not in variant,
    ).start()
    while not session.done:
        with session.iteration():
            workload.step()
    session.close()
    table = sink.table()
    steps = [
        d / 1e6
        for d, k in zip(
            table.column("dur_ns").to_pylist(), table.column("kind").to_pylist(), strict=False
        )
        if k == "step"
    ]
    return steps, table.num_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cases", default=",".join(f"{m}/{mode}/{b}" for m, mode, b in CASES))
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="a subset of: " + ", ".join(CONFIGS)
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup": args.warmup,
        "cases": [],
    }
    random.seed(0)
    for case in args.cases.split(","):
        model, mode, batch = case.split("/")
        workload = zoo.build(model, int(batch), mode, args.device)
        configs = [c for c in args.configs.split(",") if c]
        unknown = set(configs) - set(CONFIGS)
        if unknown or "none" not in configs:
            raise SystemExit(f"--configs: unknown {sorted(unknown)} (and 'none' is required)")
        per_round: dict[str, list[float]] = {c: [] for c in configs}
        ratios: dict[str, list[float]] = {c: [] for c in configs}
        spans: dict[str, int] = {}
        for _ in range(args.rounds):
            order = list(configs)
            random.shuffle(order)
            medians = {}
            for config in order:
                times, count = run_config(config, workload, args.device, args.warmup, args.iters)
                medians[config] = statistics.median(times)
                spans[config] = count
            for config in configs:
                per_round[config].append(medians[config])
                ratios[config].append(medians[config] / medians["none"])
        row = {"case": case, "configs": {}}
        for config in configs:
            row["configs"][config] = {
                "median_ms": statistics.median(per_round[config]),
                "ratio_median": statistics.median(ratios[config]),
                "ratio_min": min(ratios[config]),
                "ratio_max": max(ratios[config]),
                "spans_or_events_per_run": spans[config],
            }
        results["cases"].append(row)
        print(f"\n{case} on {results['device']}")
        print(f"{'config':<22}{'median ms':>10}{'ratio':>8}{'spread':>16}")
        for config, r in row["configs"].items():
            print(
                f"{config:<22}{r['median_ms']:>10.2f}{r['ratio_median']:>8.3f}"
                f"   [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]"
            )
        del workload
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
