"""A fix's gain measured inside one process, its two sides alternating in blocks: the truth that
``xsp verify`` (one process a side, paired rounds) and ``xsp estimate`` are held against when a
host-bound step moves ±25% between processes with nothing changed.

Each process builds the workload twice (the zoo's, random weights), once as is and once with the
fix (``channels_last``: a second copy, NHWC; ``tf32``: the same model with TF32 switched on for
its blocks), warms both, then runs BLOCKS pairs of blocks of ITERATIONS steps, the side that goes
first alternating, each step between two device synchronizes (as level M times it): the
mechanism of ``xsp verify --in-process`` (``xsp.tracer.workloads.alternating``), which this
script calls. Runs 4-7 (stop 58) used this file's own copy of it, with the zoo's NHWC build for
channels_last. A process's gain is its blocks' median step without the fix less with it; the
processes' gains and their spread are printed, one JSON line each, then a summary line.

    source benchmarks/device_setup.sh
    python3 benchmarks/fix_ab_inprocess.py --case bert-b1-infer:tf32 --processes 3 > $OUT/ab.jsonl
    python3 benchmarks/fix_ab_inprocess.py --case r50-b64-train:channels_last --processes 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: case -> (model, batch size, mode)
WORKLOADS = {
    "bert-b1-infer": ("transformers:bert", 1, "infer"),
    "r50-b64-train": ("torchvision:resnet50", 64, "train"),
}
FIXES = ("tf32", "channels_last")


def measure(case: str, fix: str, blocks: int, iterations: int, warmup: int) -> dict[str, Any]:
    """One process: both sides' block medians, alternating (``xsp verify --in-process``'s
    mechanism, ``xsp.tracer.workloads.alternating``)."""
    from xsp.tracer.workloads.alternating import BASE, FIXED, measure_zoo

    model, batch, mode = WORKLOADS[case]
    done = measure_zoo(model, batch, mode, "cuda", fix, (), False, blocks, iterations, warmup)
    medians = {
        side: [
            statistics.median(steps[k : k + iterations]) for k in range(0, len(steps), iterations)
        ]
        for side, steps in done.steps_ms.items()
    }
    gains = [b - f for b, f in zip(medians[BASE], medians[FIXED], strict=True)]
    return {
        "case": case,
        "fix": fix,
        "base_ms": statistics.median(medians[BASE]),
        "fixed_ms": statistics.median(medians[FIXED]),
        "gain_ms": statistics.median(gains),
        "block_gains_ms": [round(g, 4) for g in gains],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="WORKLOAD:FIX, e.g. bert-b1-infer:tf32")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    case, _, fix = args.case.partition(":")
    if case not in WORKLOADS or fix not in FIXES:
        known = f"workloads {list(WORKLOADS)}, fixes {list(FIXES)}"
        sys.exit(f"fix_ab_inprocess: unknown case {args.case!r} ({known})")
    if args.child:
        print(json.dumps(measure(case, fix, args.blocks, args.iterations, args.warmup)))
        return
    gains = []
    for process in range(args.processes):
        command = [sys.executable, __file__, "--child", *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"fix_ab_inprocess: process {process} failed: {done.stderr.strip()[-400:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["process"] = process
        gains.append(row["gain_ms"])
        print(json.dumps(row), flush=True)
    summary = {
        "case": args.case,
        "processes": args.processes,
        "gain_ms_median": statistics.median(gains),
        "gain_ms_min": min(gains),
        "gain_ms_max": max(gains),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
