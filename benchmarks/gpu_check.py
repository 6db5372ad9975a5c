"""The H200 check for levels F, L and G: a training run of ResNet-50 at level set MFLG, checked
against CUPTI's own kernel count for an uninstrumented iteration, with the chain of parents of
every kernel (API call, library call, op, layer).

    python benchmarks/gpu_check.py [--model torchvision:resnet50] [--batch-size 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink
from xsp.tracer.workloads import zoo


def plain_cupti_kernels(workload: zoo.Workload, iterations: int) -> list[int]:
    """Kernels per iteration as CUPTI alone counts them (no xsp level active), through the
    native core's CUPTI buffers, split by time."""
    import numpy as np

    from xsp.tracer.native.build import load

    native = load()
    offset = time.time_ns() - native.cupti_timestamp()
    native.cupti_start(["CONCURRENT_KERNEL"], 256 * 1024 * 1024, 1, [])
    bounds = []
    for _ in range(iterations):
        torch.cuda.synchronize()
        t0 = time.time_ns()
        workload.step()
        torch.cuda.synchronize()
        bounds.append((t0, time.time_ns()))
    native.cupti_stop()
    starts = np.frombuffer(native.cupti_decode()["gpu"]["start_ns"], dtype=np.int64) + offset
    native.cupti_finalize()
    # each kernel goes to the last iteration that began before it: none is lost to a clock
    # offset that moves the first or last kernels out of the windows
    slot = np.searchsorted(np.array([t0 for t0, _ in bounds]), starts, side="right") - 1
    return np.bincount(np.clip(slot, 0, iterations - 1), minlength=iterations).tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--levels", default="MFLG")
    parser.add_argument("--out")
    args = parser.parse_args()
    from xsp.tracer.capture.cupti import nvtx_environment

    os.environ.update(nvtx_environment())  # before cuBLAS, cuDNN and PyTorch first use NVTX
    workload = zoo.build(args.model, args.batch_size, "train", "cuda")
    for _ in range(3):
        workload.step()
    reference = plain_cupti_kernels(workload, args.iterations)
    sink = InMemorySink()
    session = Session(
        args.levels, iterations=args.iterations, warmup=1, sinks=[sink], device="cuda"
    ).start()
    while not session.done:
        with session.iteration():
            workload.step()
    meta = session.close() or {}
    rows = {r["span_id"]: r for r in sink.table().to_pylist()}
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    per_iteration = Counter(k["iteration"] for k in kernels)

    def chain(span: dict) -> list[str]:
        levels = []
        while span["parent_span_id"]:
            span = rows[span["parent_span_id"]]
            levels.append(span["kind"])
        return levels

    chains = [chain(k) for k in kernels]
    parents_of_kernels = set()
    for kernel in kernels:
        span = kernel
        while span["parent_span_id"]:
            span = rows[span["parent_span_id"]]
            parents_of_kernels.add(span["span_id"])
    under_op = sum(1 for c in chains if "op" in c or "backward" in c or "optimizer" in c)
    under_module = sum(1 for k in kernels if k["module_path"] is not None)
    backward = [r for r in rows.values() if r["kind"] == "backward"]
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "status": meta.get("status"),
        "errors": meta.get("errors"),
        "spans_by_level": meta.get("spans_by_level"),
        "api_ops": meta.get("api_ops"),
        "cupti": meta.get("cupti"),
        "arena": meta.get("arena"),
        "backward_nodes": len(backward),
        "backward_nodes_with_layer": sum(1 for r in backward if r["module_path"] is not None),
        "kernels_per_iteration_xsp": [per_iteration[i] for i in range(args.iterations)],
        "kernels_per_iteration_plain_cupti": reference,
        "kernels_under_api_call": sum(1 for c in chains if c and c[0] in ("runtime", "driver")),
        "kernels_under_op": under_op,
        "kernels_under_library_call": sum(1 for c in chains if "library_call" in c),
        "kernels_under_module": sum(1 for c in chains if "module" in c),
        "library_calls": Counter(
            f"{r['library']}:{r['name']}" for r in rows.values() if r["kind"] == "library_call"
        ).most_common(10),
        "library_calls_with_kernels": sum(
            1
            for r in rows.values()
            if r["kind"] == "library_call" and r["span_id"] in parents_of_kernels
        ),
        "kernels_with_layer": under_module,
        "kernels": len(kernels),
        "top_kernels": Counter(k["name"][:80] for k in kernels).most_common(5),
        "api_calls": Counter(
            r["name"] for r in rows.values() if r["level"] == "library"
        ).most_common(6),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
