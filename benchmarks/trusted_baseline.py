"""The trusted-baseline figures on the GPU machine: each workload alone (its own timing), then
under ``xsp run --levels M,MF,MFLG`` with M in several processes and interleaved untraced
iterations, and each store's two replay checks (``xsp.analysis.replay.checks``).

    python benchmarks/trusted_baseline.py --stores /tmp/trusted --out $OUT/trusted.jsonl \
        --cases r50-b64-train,amp-accum [--m-processes 3]
    python benchmarks/trusted_baseline.py --wall-rounds 2 ...   # + the K=1 against K=3 wall time

Each case writes one JSON line: the wall seconds of ``xsp run`` and of its further M processes,
the replayed step, M's interval, the in-process check, ``checked`` and ``unchecked``, the
verdict, and the workload's own median step printed when run alone. ``--wall-rounds N`` times
ResNet-50 b64 training at M,MF,MFLG with ``--m-processes 1`` and with the chosen K, alternating,
N rounds: the extra wall time of the further M processes against the measurement's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

LEVELS = "M,MF,MFLG"
WORKLOADS = "benchmarks/workloads"
#: name -> (xsp run's arguments before --, the command after it, or None for a zoo model)
CASES: dict[str, tuple[list[str], list[str] | None]] = {
    "r50-b64-train": (
        ["--model", "torchvision:resnet50", "--batch-size", "64", "--mode", "train"],
        None,
    ),
    "r50-b1-infer": (["--model", "torchvision:resnet50", "--batch-size", "1"], None),
    "amp-accum": ([], [f"{WORKLOADS}/amp_accum_train.py", "--steps", "60"]),
    "item-loop": ([], [f"{WORKLOADS}/item_loop_train.py", "--steps", "60"]),
    "gpt-lm-train": ([], [f"{WORKLOADS}/gpt_lm_train.py", "--steps", "60"]),
    "hf-generate": ([], [f"{WORKLOADS}/hf_generate.py", "--steps", "4"]),
    "b1-infer": ([], [f"{WORKLOADS}/b1_infer.py", "--steps", "60"]),
}
#: measured iterations and warm-up (the F process runs twice the iterations: one untraced
#: before each traced one; a script's steps cover both)
ITERATIONS = 20
WARMUP = {"hf-generate": 8, "amp-accum": 8}


def xsp_run(name: str, out: Path, m_processes: int, device: str) -> tuple[float, str]:
    """One leveled measurement of case ``name`` into ``out``: (wall seconds, its output)."""
    before, command = CASES[name]
    argv = [
        sys.executable,
        "-m",
        "xsp",
        "run",
        *before,
        "--levels",
        LEVELS,
        "--iterations",
        str(ITERATIONS),
        "--warmup",
        str(WARMUP.get(name, 5)),
        "--device",
        device,
        "--m-processes",
        str(m_processes),
        "--out",
        str(out),
    ]
    if command is not None:
        argv += ["--", "python3", *command]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    return time.monotonic() - began, done.stdout[-3000:] + done.stderr[-3000:]


def alone(name: str) -> float | None:
    """The workload's own median step (ms), run alone, as it prints it."""
    _, command = CASES[name]
    if command is None:
        return None
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300)
    found = re.search(r"median (?:step|call) ([0-9.]+) ms", done.stdout)
    return float(found.group(1)) if found else None


def checks(root: Path) -> dict[str, object]:
    """The store's replay with its checks, the verdict, and its M processes' seconds."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import critical_path, replay

    store = MeasurementStore(root)
    found = replay(store).summary()
    manifest = json.loads((root / "manifest.json").read_text())
    return {
        "step_ms": found["step_ms"],
        "measured_step_ms": found["measured_step_ms"],
        "error_pct": found["error_pct"],
        "in_process": found["in_process"],
        "m_interval": found["m_interval"],
        "checked": found["checked"],
        "unchecked": found["unchecked"],
        "calibration": found["calibration"],
        "activity_checks": found["checks"],
        "verdict": critical_path.verdict(store),
        "m_process_seconds": [_seconds(e) for e in manifest.get("m_processes", [])],
        "run_seconds": (manifest["finished_ns"] - manifest["created_ns"]) / 1e9,
    }


def _seconds(entry: dict[str, object]) -> float:
    """A further M process's seconds: its phases' total (a number in the first design)."""
    seconds = entry.get("seconds")
    if isinstance(seconds, dict):
        seconds = seconds.get("total")
    return float(seconds) if isinstance(seconds, (int, float)) else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--m-processes", type=int, default=3)
    parser.add_argument("--wall-rounds", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    args.stores.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as results:
        for name in [c for c in args.cases.split(",") if c]:
            own = alone(name)
            wall, said = xsp_run(name, args.stores / name, args.m_processes, args.device)
            row: dict[str, object] = {"case": name, "alone_ms": own, "wall_s": wall}
            try:
                row.update(checks(args.stores / name))
            except Exception as exc:  # the next case still runs; this one says why
                row["error"] = f"{type(exc).__name__}: {exc}"
                row["output"] = said
            print(json.dumps(row, default=str), flush=True)
            results.write(json.dumps(row, default=str) + "\n")
        for round_ in range(args.wall_rounds):
            for k in (1, args.m_processes):
                out = args.stores / f"wall-k{k}-{round_}"
                wall, _ = xsp_run("r50-b64-train", out, k, args.device)
                manifest = json.loads((out / "manifest.json").read_text())
                extra = sum(_seconds(e) for e in manifest.get("m_processes", []))
                row = {
                    "case": "wall",
                    "m_processes": k,
                    "round": round_,
                    "wall_s": wall,
                    "m_process_seconds": extra,
                }
                print(json.dumps(row), flush=True)
                results.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
