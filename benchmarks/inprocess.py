"""Level sets against the untraced loop in one process, in rounds: where each level's cost goes.

On the shared H200 host a fresh process's untraced step varies by up to 2x from the next one's,
and within one process by up to 1.75x over a minute (`benchmarks/results/inprocess-h200/`). This
method cancels both: one process per case runs rounds, and each round runs every configuration
once, in shuffled order. An xsp configuration is a fresh session of ITERS measured iterations
(WARMUP iterations under the levels first). Its ratio in a round is its median step over the
same round's untraced median. We report the median ratio over rounds with its spread.

Configurations are level sets, plus ``MFLG(no correlation)``: L and G without level F's ops
pushing CUPTI external correlation ids (the API calls then join their ops by time). The
libraries' NVTX ranges are routed into CUPTI for the whole process, as `xsp run` does for a
level-set process with L, so the untraced loop pays what NVTX injection costs while CUPTI is
idle. torch.profiler cannot share a process with xsp's CUPTI session
(`benchmarks/overhead.py` measures it in processes of its own).

    python benchmarks/inprocess.py --case torchvision:resnet50/infer/1 \
        [--configs none,MF,MLG,MFLG] [--rounds 8] [--iters 100] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import _sync, _timed, _without_correlation, _xsp, build_step


def _summary(rounds: list[dict[str, float]], configs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"none_step_ms": statistics.median(r["none"] for r in rounds)}
    for config in configs:
        if config == "none":
            continue
        ratios = [r[config] / r["none"] for r in rounds]
        out[config] = {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "step_ms": statistics.median(r[config] for r in rounds),
            "added_ms": statistics.median(r[config] - r["none"] for r in rounds),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--configs", default="none,MF,MLG,MFLG")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if "none" not in configs:
        configs.insert(0, "none")
    if any("L" in c for c in configs) and args.device.startswith("cuda"):
        from xsp.tracer.capture.hooks.cupti import nvtx_environment

        os.environ.update(nvtx_environment())  # before the libraries first use NVTX
    step = build_step(args.case, args.device)
    sync = _sync(args.device)
    _timed(step, sync, 3 * args.warmup)
    rounds: list[dict[str, float]] = []
    spans: dict[str, int] = {}
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="xsp-inprocess-") as tmp:
        for index in range(args.rounds):
            medians: dict[str, float] = {}
            for config in random.sample(configs, len(configs)):
                if config == "none":
                    medians[config] = statistics.median(_timed(step, sync, args.iters))
                    continue
                levels, _, variant = config.partition("(")
                out = Path(tmp) / f"{index}-{len(medians)}"
                plain = variant.removesuffix(")") == "no correlation"
                restore = _without_correlation() if plain else (lambda: None)
                try:
                    times, spans[config], _, _ = _xsp(
                        levels, step, args.device, args.warmup, args.iters, out, True
                    )
                finally:
                    restore()
                medians[config] = statistics.median(times)
            rounds.append(medians)
            print(f"round {index}: " + "  ".join(f"{c} {medians[c]:.3f}" for c in configs))
            sys.stdout.flush()
            if args.out:  # after every round: a job stopped by its time limit keeps the rest
                result = {"case": args.case, "iters": args.iters, "warmup": args.warmup}
                result |= {"rounds": rounds, "spans": spans}
                result["summary"] = _summary(rounds, configs)
                args.out.write_text(json.dumps(result, indent=1))
    summary = _summary(rounds, configs)
    print(f"{args.case}: untraced {summary['none_step_ms']:.3f} ms")
    for config in configs[1:]:
        s = summary[config]
        print(
            f"  {config:<24} {s['ratio']:.3f}x [{s['ratio_min']:.2f}, {s['ratio_max']:.2f}]"
            f"  +{s['added_ms']:.3f} ms per step"
        )


if __name__ == "__main__":
    main()
