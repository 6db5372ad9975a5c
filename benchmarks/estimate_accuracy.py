"""Each kernel-changing rule's estimate against ``xsp verify``'s measurement, on the GPU machine:
the modelled estimate (no isolated timings), the estimate from ``xsp estimate`` (the changed ops
timed in isolation, replayed), and the paired rounds' measured gain with its interval.

    source benchmarks/device_setup.sh    # on the device (or: bash benchmarks/device.sh estimate-accuracy)
    python3 benchmarks/estimate_accuracy.py --stores /tmp/estimate-accuracy --out $OUT \
        [--cases r50-b64-train,bert-b1-infer] [--rounds 2] [--iterations 8]

Cases: ResNet-50 b64 training (torchvision, random weights), layout-transposes -> channels_last;
BERT b1 inference (transformers, random weights, nothing downloaded), fp32-on-tensor-cores ->
tf32. Each: ``xsp run --levels M,MF,MFLG``, the suggestion as modelled, ``xsp estimate --fix``,
``xsp verify --rule`` (its predicted gain is then the isolation estimate). Writes
``estimate-accuracy.json`` (one object per case) and ``estimate-accuracy.txt`` (the table of
docs/verify.md) into ``--out``; every command's output goes to ``<case>-<step>.log`` there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LEVELS = "M,MF,MFLG"
WARMUP = 3
#: name -> (xsp run's workload arguments, the rule, its fix)
CASES: dict[str, tuple[list[str], str, str]] = {
    "r50-b64-train": (
        ["--model", "torchvision:resnet50", "--batch-size", "64", "--mode", "train"],
        "layout-transposes",
        "channels_last",
    ),
    "bert-b1-infer": (
        ["--model", "transformers:bert", "--batch-size", "1", "--mode", "infer"],
        "fp32-on-tensor-cores",
        "tf32",
    ),
}


def _xsp(args: list[str], log: Path, limit_s: float) -> tuple[int, str, float]:
    """(return code, stdout, seconds) of ``python -m xsp ARGS``; stderr into ``log``."""
    begin = time.perf_counter()
    with log.open("w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "xsp", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=limit_s,
        )
    return done.returncode, done.stdout, time.perf_counter() - begin


def _modelled(run: Path, rule: str) -> dict[str, Any] | None:
    """The rule's suggestion before any isolated timing exists (its estimate, modelled)."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.suggestions.rules import suggest

    rows = suggest(MeasurementStore(run)).to_pylist()
    return next((r for r in rows if r["rule"] == rule), None)


def measure(name: str, stores: Path, out: Path, rounds: int, iterations: int) -> dict[str, Any]:
    workload, rule, fix = CASES[name]
    run = stores / name
    row: dict[str, Any] = {"case": name, "rule": rule, "fix": fix}
    counts = ["--iterations", str(iterations), "--warmup", str(WARMUP)]
    code, _, seconds = _xsp(
        ["run", *workload, "--levels", LEVELS, *counts, "--device", "cuda", "--out", str(run)],
        out / f"{name}-run.log",
        300,
    )
    row["run_s"] = round(seconds, 1)
    if code != 0:
        return {**row, "error": f"xsp run: rc {code}"}
    found = _modelled(run, rule)
    if found is None:
        return {**row, "error": f"{rule} does not fire"}
    row["modelled_ms"] = found["gain_ms_per_iteration"]
    row["modelled_as"] = found["estimate"]
    code, stdout, seconds = _xsp(
        ["estimate", str(run), "--fix", fix, "--json"], out / f"{name}-estimate.log", 120
    )
    row["estimate_s"] = round(seconds, 1)
    if code != 0:
        return {**row, "error": f"xsp estimate: rc {code}"}
    (estimated,) = json.loads(stdout)["fixes"]
    row["isolation_ms"] = estimated["gain_ms_per_iteration"]
    row["isolation_cases"] = estimated["cases"]
    row["isolation_timing_s"] = estimated["timing_s"]
    code, stdout, seconds = _xsp(
        ["verify", str(run), "--rule", rule, "--rounds", str(rounds), "--json"],
        out / f"{name}-verify.log",
        360,
    )
    row["verify_s"] = round(seconds, 1)
    if code != 0 or not stdout.strip():
        return {**row, "error": f"xsp verify: rc {code}"}
    (verified,) = json.loads(stdout)["rows"]
    row["predicted_ms"] = verified["predicted_gain_ms_per_iteration"]
    row["measured_ms"] = verified["measured_gain_ms_per_iteration"]
    row["measured_ci_ms"] = verified["measured_gain_ci_ms"]
    row["measured_pct"] = verified["measured_gain_pct"]
    row["status"] = verified["status"]
    return row


def _ratio(estimate: float | None, measured: float | None) -> str:
    if estimate is None or not measured:
        return "-"
    return f"{estimate / measured:.2f}x"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| measurement | rule, fix | modelled | measured in isolation | xsp verify (95% interval) "
        "| isolation / verify |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['rule']}, {r['fix']} | {r['error']} | | | |")
            continue
        low, high = r["measured_ci_ms"] or (None, None)
        lines.append(
            f"| {r['case']} | {r['rule']}, {r['fix']} | {r['modelled_ms']:.2f} ms "
            f"| {r['isolation_ms']:.2f} ms ({r['isolation_cases']} shapes, "
            f"{r['isolation_timing_s']:.1f} s) | {r['measured_ms']:.2f} ms ({low:.2f}–{high:.2f}) "
            f"| {_ratio(r['isolation_ms'], r['measured_ms'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=Path, default=Path("/tmp/estimate-accuracy"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.stores.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases.split(","):
        begin = time.perf_counter()
        row = measure(name, args.stores, args.out, args.rounds, args.iterations)
        row["total_s"] = round(time.perf_counter() - begin, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        (args.out / "estimate-accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = table(rows)
    (args.out / "estimate-accuracy.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
