"""`xsp run --model` with level-set processes forked from a preloaded server and overlapped (each
started while the one before finishes), with MF run after M in M's process or in its own, forked
one after the other, and in fresh interpreters (``CONFIGS``), in rounds that rotate their order,
beside the untraced loop run as a user's script would run it.

For each run: the command's wall time, each level set's phases from the manifest and median
step, the MF process's own untraced steps and the replay's error against M. A forked or shared
level set must measure what a fresh one does, only sooner: compare the steps, not just the wall
times.

    python benchmarks/fork_server_run.py --model torchvision:resnet50 --mode infer \
        --batch-size 1 --device cuda --rounds 3 --configs shared,forked,fresh --out fork-run.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

UNTRACED = """
import sys, torch
from xsp.tracer.workloads import zoo
model, mode, batch, device, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
w = zoo.build(model, batch, mode, device)
for _ in range(steps):
    w.step()
    if device == "cuda":
        torch.cuda.synchronize()
"""


def untraced(args: argparse.Namespace) -> dict[str, Any]:
    steps = args.warmup + args.iterations
    began = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            UNTRACED,
            args.model,
            args.mode,
            str(args.batch_size),
            args.device,
            str(steps),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "config": "untraced",
        "rc": done.returncode,
        "wall_s": round(time.perf_counter() - began, 2),
        "stderr": done.stderr[-300:],
    }


#: How each configuration starts its level sets: ``shared`` is xsp run's default (a fork server,
#: MF run after M in M's process, each process started while the one before finishes),
#: ``shared-serial`` the same with each process started once the one before has ended (on a
#: GPU, ``shared`` starts them at once and warms them up side by side), ``forked`` gives MF a
#: process of its own, ``serial`` forks them one after the other, ``fresh``
#: starts a new interpreter for each, one after the other (xsp run before the other three).
CONFIGS = {
    "shared": {"XSP_FORK_SERVER": "1", "XSP_OVERLAP": "1", "XSP_SHARE_PROCESS": "1"},
    "shared-serial": {"XSP_FORK_SERVER": "1", "XSP_OVERLAP": "0", "XSP_SHARE_PROCESS": "1"},
    "forked": {"XSP_FORK_SERVER": "1", "XSP_OVERLAP": "1", "XSP_SHARE_PROCESS": "0"},
    "serial": {"XSP_FORK_SERVER": "1", "XSP_OVERLAP": "0", "XSP_SHARE_PROCESS": "0"},
    "fresh": {"XSP_FORK_SERVER": "0", "XSP_OVERLAP": "0", "XSP_SHARE_PROCESS": "0"},
}


def leveled(args: argparse.Namespace, config: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, **CONFIGS[config]}
    command = [
        sys.executable,
        "-m",
        "xsp",
        "run",
        "--model",
        args.model,
        "--mode",
        args.mode,
        "--batch-size",
        str(args.batch_size),
        "--device",
        args.device,
        "--levels",
        args.levels,
        "--iterations",
        str(args.iterations),
        "--warmup",
        str(args.warmup),
        "--out",
        str(out),
    ]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    row: dict[str, Any] = {
        "config": config,
        "rc": done.returncode,
        "wall_s": round(time.perf_counter() - began, 2),
    }
    if done.returncode:
        row["stderr"] = done.stderr[-500:]
        return row
    manifest = json.loads((out / "manifest.json").read_text())
    row["seconds"] = {run["levels"]: run.get("seconds") for run in manifest["runs"]}
    row.update(replayed(out))
    return row


def replayed(out: Path) -> dict[str, Any]:
    from xsp.analysis.measurement.matching import level_sources
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import replay
    from xsp.analysis.replay.host_timeline import calibration
    from xsp.analysis.tables.summary import level_sets
    from xsp.core import schema

    store = MeasurementStore(out)
    found = replay(store).summary()
    own = found.get("in_process") or {}
    across = found.get("m_interval") or {}
    steps = {row["levels"]: row["step_median_ms"] for row in level_sets(store).to_pylist()}
    probe = calibration(store, level_sources(store)[1].get(schema.LEVEL_FRAMEWORK))
    return {
        # the F run's probe, as it measured it (the replay's summary has it as fitted)
        "calibration": {
            "framework_ns_per_record": probe.op_ns,
            "module_ns_per_call": probe.module_ns,
        },
        "step_ms": {levels: round(ms, 3) for levels, ms in steps.items() if ms is not None},
        "m_step_ms": round(found["measured_step_ms"], 3),
        "replayed_ms": round(found["step_ms"], 3),
        "error_pct": round(found["error_pct"], 2),
        "mf_untraced_ms": own.get("untraced_ms"),
        "replay_vs_mf_untraced_pct": own.get("error_pct"),
        "m_interval_ms": [across.get("low_ms"), across.get("high_ms")] if across else None,
        "checked": found.get("checked"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--mode", default="infer")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--levels", default="M,MF,MFLG")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--configs", default="shared,forked", help=f"comma-separated, of {', '.join(CONFIGS)}"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = [untraced(args)]
    print(rows[-1], flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="fork-run-"))
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}: use {', '.join(CONFIGS)}")
    for round_ in range(args.rounds):
        shift = round_ % len(configs)  # rotate which goes first
        for config in configs[shift:] + configs[:shift]:
            out = scratch / f"{round_}-{config}"
            rows.append({"round": round_, **leveled(args, config, out)})
            print({k: v for k, v in rows[-1].items() if k != "seconds"}, flush=True)
            shutil.rmtree(out, ignore_errors=True)
    rows.append(untraced(args))
    print(rows[-1], flush=True)
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
