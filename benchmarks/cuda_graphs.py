"""CUDA graph attribution on real workloads: how many replayed kernels reach the op, layer and
phase that made their node, and how the layers compare with the same model run eagerly.

Cases (each in a fresh process, a session at MFLG started before the program's capture):
- ``graphed-train``: tests/test_cuda_graphs.py's CNN, forward and backward graphed by
  ``torch.cuda.make_graphed_callables``;
- ``compile-ro-infer``: the zoo ResNet-18, batch 8 inference, ``torch.compile(mode=
  "reduce-overhead")`` (inductor's CUDA graph trees), against ``torch.compile`` default mode.

    python benchmarks/cuda_graphs.py --out cuda-graphs.json      # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def compiled_case(mode: str) -> dict[str, Any]:
    """ResNet-18 b8 inference compiled in ``mode``, 5 measured iterations at MFLG."""
    from xsp.tracer.capture.hooks.cupti import nvtx_environment

    os.environ.update(nvtx_environment())
    import torch

    from xsp.tracer.capture.session import Session
    from xsp.tracer.export.sinks import InMemorySink
    from xsp.tracer.workloads import zoo

    workload = zoo.build("torchvision:resnet18", 8, "infer", "cuda")
    model = torch.compile(workload.model, mode=mode)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    sink = InMemorySink()
    session = Session("MFLG", iterations=5, warmup=4, sinks=[sink], device="cuda").start()
    with torch.no_grad():
        while not session.done:
            with session.iteration():
                model(x)
    meta = session.close() or {}
    activities = [r for r in sink.table().to_pylist() if r["level"] == "gpu"]
    rows = [r for r in activities if r["kind"] == "kernel"]
    layers = Counter(r["module_path"] or "(none)" for r in rows)
    # copies and sets a graph replays (a capture's memset nodes) reach their node too
    others = [r for r in activities if r["kind"] != "kernel" and r["graph_node"] is not None]
    return {
        "mode": mode,
        "status": meta.get("status"),
        "errors": meta.get("errors"),
        "levels_on_early": meta.get("levels_on_early"),
        "graph_kernels": meta.get("graph_kernels"),
        "kernels": len(rows),
        "kernels_replayed": sum(1 for r in rows if r["graph_node"] is not None),
        "distinct_layers": len(layers),
        "kernels_at_the_root": layers.get("", 0),
        "kernels_without_layer": layers.get("(none)", 0),
        "copies_and_sets_replayed": dict(Counter(r["kind"] for r in others)),
        "copies_and_sets_replayed_without_layer": sum(1 for r in others if not r["module_path"]),
    }


def graphed_case(graphed: bool) -> dict[str, Any]:
    from tests.test_cuda_graphs import graph_session_check

    result = graph_session_check(graphed)
    result["layers_kernels"] = {k: sum(n for _, n in v) for k, v in result.pop("layers").items()}
    return result


def _fresh(function: str, **arguments: Any) -> dict[str, Any]:
    """A case in a fresh process; what went wrong where it failed."""
    from tests.fixtures import in_fresh_process

    try:
        return dict(in_fresh_process("benchmarks.cuda_graphs", function, timeout=400, **arguments))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return {"failed": str(exc)[-3000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = {
        "graphed-train": _fresh("graphed_case", graphed=True),
        "eager-train": _fresh("graphed_case", graphed=False),
        "compile-ro-infer": _fresh("compiled_case", mode="reduce-overhead"),
        "compile-default-infer": _fresh("compiled_case", mode="default"),
    }
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
