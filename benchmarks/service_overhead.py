"""What tracing a batch-1 inference service costs each request (CPU, or ``--device cuda``): untraced, level M on
every request, level F sampled on 1 request in ``--sample-every`` (issue 28's figures: M at
most 1% added latency, F sampled at 1 in 100 at most 2% added to the mean; p50 and p99 too), and
level F on every request: what the other way to sample, F kept on and the unsampled requests'
records dropped at conversion, would cost each request.

One process runs rounds; each round runs every configuration once, in shuffled order, so that
the host's drift cancels within a round. A configuration's turn is ``--requests`` requests (one
forward pass of an MLP, batch 1, each timed around the call as the service's caller sees it)
after ``--warmup`` untimed ones; a traced turn is a fresh continuous session (``iterations=0``,
iterations found as root-module calls) storing its batches into a temporary run directory in the
background, as a service's would (every ``--export-every`` seconds: short, so that each timed
turn pays for batches stored while it runs). Reported per configuration: the median over rounds of its
mean request against the same round's untraced mean, the median over rounds of its median
request against the untraced one's (ratio and µs added: robust to a shared host's spikes), and
the mean, p50 and p99 over every timed request of every round. On CUDA a request ends when its
output is ready (a device sync after the call), as the service's caller reads it.

For F sampled, the requests are also split by position (timed request i is measured iteration
i): the sampled ones (level F switched on as each begins), the ones right after them (F switched
off as each begins) and the others; the medians of the first two above the others', over
``--sample-every``, are what sampling F adds to the mean request, robust to a shared host's
spikes (the batch hand-overs, every ``--export-every`` s, are left out of it).

    python benchmarks/service_overhead.py [--rounds 10] [--requests 2000] [--width 512]
        [--sample-every 100] [--sampled MF,MFLG] [--export-every 0.5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import xsp


def model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).eval()


def turn(config: str, net: torch.nn.Module, x: torch.Tensor, args: Any, tmp: Path) -> list[int]:
    """One configuration's timed requests (ns each)."""
    session = None
    if config != "none":
        # "MF": F on every request, what keeping the level on and dropping the unsampled
        # iterations' records at conversion would cost each request
        levels, _, way = config.split()[0].partition(":")
        every = int(config.split("/")[1]) if "/" in config else 1
        # MFLG:finalize: L and G's CUPTI switched off between sampled requests that way
        # (XSP_CUPTI_SAMPLING), for the two ways side by side in one process; MFLG:run20: the
        # sample in runs of 20 requests (CUPTI finalized between runs)
        run = _run_length(config)
        os.environ["XSP_CUPTI_SAMPLING"] = way if way == "finalize" else "pause"
        session = xsp.session(
            levels,
            iterations=0,
            warmup=args.warmup,
            out=tmp / f"{levels}-{way or 'pause'}-{time.monotonic_ns()}" / levels,
            device=args.device,
            auto_iterations=True,
            sample_every=every,
            sample_run=run,
            export_every_s=args.export_every,
            monitor=False,
        )
    times = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            net(x)
        clock = time.perf_counter_ns
        ready = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        for _ in range(args.requests):
            start = clock()
            net(x)
            ready()
            times.append(clock() - start)
    if session is not None:
        meta = session.close() or {}
        assert meta.get("status") == "ok", meta.get("status_reasons")
    return times


def _run_length(config: str) -> int:
    """K of a configuration ``LEVELS:runK 1/N`` (1 for the others)."""
    way = config.split()[0].partition(":")[2]
    return int(way[3:]) if way.startswith("run") else 1


def _position(config: str, index: int, every: int) -> str:
    """Where timed request ``index`` falls in its configuration's sampling cycle."""
    run = _run_length(config)
    position = index % (every * run)
    return "sampled" if position < run else "after" if position == run else "others"


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument(
        "--sampled",
        default="MF",
        help="level sets traced on 1 request in --sample-every, comma-separated (MF,MFL on the "
        "CPU; MF,MFLG on CUDA; MFLG:finalize for CUPTI finalized between sampled requests; "
        "MFLG:run20 for the sample in runs of 20, CUPTI finalized between runs)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    # short, so that batches are stored in the background during each timed turn
    parser.add_argument("--export-every", type=float, default=0.5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sampled = [f"{levels} 1/{args.sample_every}" for levels in args.sampled.split(",")]
    configs = ["none", "M", *sampled, "MF"]
    net = model(args.width).to(args.device)
    x = torch.randn(1, args.width, device=args.device)
    times: dict[str, list[int]] = {c: [] for c in configs}
    ratios: dict[str, list[float]] = {c: [] for c in configs[1:]}
    # per round, a turn's median request against the untraced turn's: robust to the spikes a
    # shared host puts into means, and its difference is the tracer's cost per request
    p50_ratios: dict[str, list[float]] = {c: [] for c in configs[1:]}
    p50_added: dict[str, list[float]] = {c: [] for c in configs[1:]}
    # each sampled configuration: every timed request of every round by its position in the
    # sampling cycle
    every = args.sample_every
    cycles: dict[str, dict[str, list[int]]] = {
        c: {"sampled": [], "after": [], "others": []} for c in sampled
    }
    # per round, the unsampled requests' median against level M's: what they pay beyond M
    others_vs_m: dict[str, list[float]] = {c: [] for c in sampled}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = configs[:]
            rng.shuffle(order)
            means, medians = {}, {}
            for config in order:
                got = turn(config, net, x, args, Path(tmp))
                times[config] += got
                if config in cycles:
                    others = []
                    for i, t in enumerate(got):
                        position = _position(config, i, every)
                        cycles[config][position].append(t)
                        if position == "others":
                            others.append(t)
                    medians[f"{config} others"] = statistics.median(others)
                means[config] = statistics.fmean(got)
                medians[config] = statistics.median(got)
            for config in sampled:
                others_vs_m[config].append((medians[f"{config} others"] - medians["M"]) / 1e3)
            for config in configs[1:]:
                ratios[config].append(means[config] / means["none"])
                p50_ratios[config].append(medians[config] / medians["none"])
                p50_added[config].append((medians[config] - medians["none"]) / 1e3)
            print(
                f"round {round_index + 1}: "
                + ", ".join(f"{c} {means[c] / 1e3:.1f} µs" for c in configs),
                flush=True,
            )
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    print(
        f"\n{'config':>10} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8} {'mean vs none':>22} "
        f"{'p50 vs none':>12} {'p50 added µs':>13}"
    )
    for config in configs:
        row = {
            "mean_us": statistics.fmean(times[config]) / 1e3,
            "p50_us": percentile(times[config], 0.50),
            "p99_us": percentile(times[config], 0.99),
        }
        if config in ratios:
            r = ratios[config]
            row.update(ratio=statistics.median(r), ratio_min=min(r), ratio_max=max(r))
            row.update(
                p50_ratio=statistics.median(p50_ratios[config]),
                p50_added_us=statistics.median(p50_added[config]),
            )
            versus = f"{row['ratio']:.4f}x [{min(r):.3f}, {max(r):.3f}]"
            versus += f" {row['p50_ratio']:11.4f}x {row['p50_added_us']:13.2f}"
        else:
            versus = ""
        results[config] = row
        print(
            f"{config:>10} {row['mean_us']:9.1f} {row['p50_us']:8.1f} {row['p99_us']:8.1f} "
            f"{versus:>22}"
        )
    for config, cycle in cycles.items():
        medians = {k: statistics.median(v) / 1e3 for k, v in cycle.items() if v}
        if len(medians) < 3:
            continue
        run = _run_length(config)
        added = (run * medians["sampled"] + medians["after"] - (run + 1) * medians["others"]) / (
            every * run
        )
        # a run's first request pays CUPTI's start, which no median sees: every sampled and
        # after request's time above the others' median, spread over all requests
        total = sum(len(v) for v in cycle.values())
        excess = sum(t / 1e3 - medians["others"] for t in cycle["sampled"] + cycle["after"])
        key = "sampled_cycle" if config == sampled[0] else f"sampled_cycle {config}"
        results[key] = {f"{k}_p50_us": v for k, v in medians.items()}
        results[key]["added_to_mean_us"] = added
        results[key]["added_to_mean_us_all_excess"] = excess / total
        results[key]["others_p50_minus_m_us"] = statistics.median(others_vs_m[config])
        print(
            f"\n{config}: p50 of the sampled requests {medians['sampled']:.1f} µs, of the "
            f"ones after them {medians['after']:.1f} µs, of the others {medians['others']:.1f} "
            f"µs: sampling adds {added:.2f} µs to the mean request from the medians, "
            f"{excess / total:.2f} µs from every sampled and after request's excess; the "
            f"unsampled requests' p50 minus M's {statistics.median(others_vs_m[config]):+.2f} "
            "µs (median over rounds)"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
