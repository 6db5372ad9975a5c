"""Per-iteration overhead of xsp's level sets against the uninstrumented step, with
torch.profiler measured in the same process for comparison, and peak host memory (``--rss``:
one fresh process per configuration, since peak RSS only grows within a process).

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
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink
from xsp.tracer.workloads import zoo

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
    "MF(nvtx)",
    "MLG",
    "MFL",
    "MFLG",
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
    if "nvtx" in variant:
        os.environ["XSP_FRAMEWORK_CAPTURE"] = "nvtx"
    else:
        os.environ.pop("XSP_FRAMEWORK_CAPTURE", None)
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


def peak_rss(case: str, configs: list[str], device: str, iters: int) -> dict[str, float]:
    """Peak host RSS (MB) of a fresh process that runs ``case`` under each configuration."""
    peaks = {}
    for config in configs:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--rss-child",
                config,
                "--cases",
                case,
                "--device",
                device,
                "--iters",
                str(iters),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise SystemExit(f"rss child {config} failed: {done.stderr[-2000:]}")
        peaks[config] = float(lines[-1])
    return peaks


def _rss_child(config: str, case: str, device: str, iters: int) -> None:
    model, mode, batch = case.split("/")
    workload = zoo.build(model, int(batch), mode, device)
    run_config(config, workload, device, 5, iters)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rss", action="store_true", help="measure peak RSS per configuration")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
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
    configs_all = [c for c in (args.rss_child or args.configs).split(",") if c]
    cupti_configs = [c for c in configs_all if "L" in c.split("(")[0] or "G" in c.split("(")[0]]
    if cupti_configs and args.device.startswith("cuda"):
        # NVTX routing must be in place before the libraries start; it then applies to every
        # configuration of this process, the uninstrumented one included (fair to compare).
        from xsp.tracer.capture.cupti import nvtx_environment

        os.environ.update(nvtx_environment())
    if args.rss_child:
        _rss_child(args.rss_child, args.cases, args.device, args.iters)
        return
    if args.rss:
        configs = [c for c in args.configs.split(",") if c]
        report = {}
        for case in args.cases.split(","):
            peaks = peak_rss(case, configs, args.device, args.iters)
            report[case] = peaks
            print(f"\npeak RSS, {case}")
            for config, mb in peaks.items():
                print(f"{config:<28}{mb:>10.0f} MB{mb / peaks['none']:>8.3f}x")
        if args.out:
            Path(args.out).write_text(json.dumps({"peak_rss_mb": report}, indent=1))
        return
    results: dict[str, Any] = {
        "nvtx_environment": bool(cupti_configs),
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
