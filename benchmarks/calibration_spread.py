"""How much F's calibration varies, and what it costs, with its rounds' sizes, in one process.

    python benchmarks/calibration_spread.py [--repeats 12] [--device cuda] \
        [--configs 20x5,50x7] [--out FILE.json]

The calibration (``xsp.tracer.capture.calibrate``) times two probes in rounds of F off and on;
the replay takes its cost per record off the F run's host times (and raises it where the F
process's own untraced steps show more). A configuration is CALLSxROUNDS. Each repeat runs
every configuration once, in rotating order, as a fresh MF session of one iteration of a small
model on the device (the probes run where the program runs). Within one process, the spread
over repeats is the method's own noise. Per configuration: the cost of an op record and of a
module record (median, quartiles, extremes) and the calibration's seconds.

``results/calibration-h200/calibration-spread.json`` also holds the design this replaced,
``sequential:50x7`` (seven levels-off rounds of 50 calls, then seven levels-on ones), beside
``paired:CALLSxROUNDS``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from xsp.tracer.capture import calibrate
from xsp.tracer.capture.session import Session
from xsp.tracer.workloads import zoo


def _configure(config: str) -> None:
    calls, _, rounds = config.partition("x")
    if not (calls.isdigit() and rounds.isdigit()):
        sys.exit(f"calibration_spread: {config!r} is not CALLSxROUNDS (such as 20x5)")
    calibrate.CALLS, calibrate.ROUNDS = int(calls), int(rounds)


def _one(config: str, workload: Any, device: str, out: Path) -> dict[str, float]:
    _configure(config)
    session = Session("MF", iterations=1, warmup=0, out=out, device=device).start()
    with session.iteration():
        workload.step()
    session.close()
    meta = json.loads((out / "run.json").read_text())
    found = meta.get("calibration") or {}
    parts = meta.get("switch_on_ms") or {}
    return {
        "op_ns": found.get("framework_ns_per_record", float("nan")),
        "module_ns": found.get("module_ns_per_call", float("nan")),
        "step_off_ns": found.get("probes", {}).get("step", {}).get("off_ns", float("nan")),
        "seconds": sum(v for k, v in parts.items() if k.startswith("calibration")) / 1e3,
    }


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else ordered * 3
    return {
        "median": round(statistics.median(ordered), 1),
        "q1": round(quartiles[0], 1),
        "q3": round(quartiles[2], 1),
        "min": round(ordered[0], 1),
        "max": round(ordered[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", default="20x5,50x7,25x5,20x4,10x7")
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = args.configs.split(",")
    workload = zoo.build(args.model, 1, "infer", args.device)
    workload.step()
    rows: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            shift = repeat % len(configs)
            for n, config in enumerate(configs[shift:] + configs[:shift]):
                rows[config].append(
                    _one(config, workload, args.device, Path(tmp) / f"{repeat}-{n}")
                )
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"device": args.device, "repeats": args.repeats, "configs": {}}
    for config, found in rows.items():
        report["configs"][config] = {
            key: _spread([row[key] for row in found])
            for key in ("op_ns", "module_ns", "step_off_ns")
        } | {"seconds_mean": round(statistics.mean(row["seconds"] for row in found), 3)}
        line = report["configs"][config]
        print(
            f"{config:>16}: op {line['op_ns']['median']:.0f} ns "
            f"[{line['op_ns']['q1']:.0f}, {line['op_ns']['q3']:.0f}] "
            f"({line['op_ns']['min']:.0f}-{line['op_ns']['max']:.0f}), "
            f"module {line['module_ns']['median']:.0f} ns "
            f"[{line['module_ns']['q1']:.0f}, {line['module_ns']['q3']:.0f}], "
            f"{line['seconds_mean']:.3f} s"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
