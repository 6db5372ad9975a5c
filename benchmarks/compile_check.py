"""A torch.compile'd model under level F: dynamo's graph breaks, graphs and recompiles before
and after the levels come on (F must add none), and the step time of each phase.

    python benchmarks/compile_check.py [--model torchvision:resnet18] [--batch-size 32]
        [--device cuda] [--backend inductor] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": int(counters["frames"]["ok"]),
        "recompiles": sum(counters["recompiles"].values()),
    }


def check(model: str, batch: int, device: str, backend: str, iterations: int) -> dict[str, Any]:
    import torch

    from xsp.tracer import store
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    workload = zoo.build(model, batch, "train", device)
    workload.model = torch.compile(workload.model, backend=backend)  # type: ignore[assignment]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(iterations + 3):
        sync()
        t0 = time.perf_counter()
        workload.step()
        sync()
        times.append(time.perf_counter() - t0)
    before = dynamo_counts()
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(
            "MF", iterations=iterations, warmup=0, out=Path(tmp) / "MF", device=device
        )
        session.start()
        while not session.done:
            with session.iteration():
                workload.step()
        meta = session.close() or {}
        spans = store.open_run(Path(tmp) / "MF").spans().to_pylist()
    after = dynamo_counts()
    steps = [s["dur_ns"] / 1e6 for s in spans if s["kind"] == "step"]
    kinds: dict[str, int] = {}
    for span in spans:
        kinds[span["kind"]] = kinds.get(span["kind"], 0) + 1
    compiled = sorted({s["name"] for s in spans if "Compiled" in (s["name"] or "")})[:5]
    return {
        "model": model,
        "batch_size": batch,
        "backend": backend,
        "status": meta.get("status"),
        "dynamo_before_F": before,
        "dynamo_after_F": after,
        "added_by_F": {k: after[k] - before[k] for k in before},
        "untraced_step_ms": statistics.median(times[3:]) * 1e3,
        "mf_step_ms": statistics.median(steps) if steps else None,
        "spans_by_kind": kinds,
        "compiled_region_spans": compiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()
    result = check(args.model, args.batch_size, args.device, args.backend, args.iterations)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
