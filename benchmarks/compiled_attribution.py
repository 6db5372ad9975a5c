"""How far inductor's provenance attributes a torch.compile'd model's generated kernels to the
modules they came from: a training run at MFLG (MF on CPU), the session made before the model
is compiled, as under ``xsp run``.

    python benchmarks/compiled_attribution.py [--model torchvision:resnet18] [--batch-size 32]
        [--device cuda] [--out FILE.json]

Prints, for the first measured iteration: the generated kernels (Triton on CUDA, C++ kernel
ranges on CPU), how many sit in a module below the compiled root, and the GPU (or CPU) time per
top-level module.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(model: str, batch: int, device: str, iterations: int) -> dict[str, Any]:
    import torch

    from xsp.tracer import store
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    cuda = device.startswith("cuda")
    levels = "MFLG" if cuda else "MF"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / levels
        session = Session(levels, iterations=iterations, warmup=2, out=out, device=device)
        workload = zoo.build(model, batch, "train", device)
        workload.model = torch.compile(workload.model)  # type: ignore[assignment]
        session.start()
        while not session.done:
            with session.iteration():
                workload.step()
        meta = session.close() or {}
        spans = store.open_run(out).spans().to_pylist()
    first = [s for s in spans if s["iteration"] == 0]
    if cuda:
        generated = [s for s in first if s["kind"] == "kernel" and s["name"].startswith("triton")]
        kernels = [s for s in first if s["kind"] == "kernel"]
    else:
        generated = [s for s in first if s["name"].startswith("graph_") and "cpp_" in s["name"]]
        kernels = generated
    root = "_orig_mod"
    below = [s for s in generated if (s["module_path"] or "").startswith(root + ".")]
    per_module: Counter[str] = Counter()
    for s in generated:
        path = s["module_path"] or ""
        top = path.removeprefix(root + ".").split(".")[0] if path.startswith(root + ".") else ""
        per_module[top or "(the compiled root)"] += s["dur_ns"]
    return {
        "model": model,
        "batch": batch,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "levels": levels,
        "status": meta.get("status"),
        "kernels": len(kernels),
        "generated_kernels": len(generated),
        "below_root": len(below),
        "distinct_modules": len({s["module_path"] for s in below}),
        "ms_by_top_module": {k: v / 1e6 for k, v in per_module.most_common()},
        "examples": [(s["name"], s["phase"], s["module_path"]) for s in generated[:12]],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    result = measure(args.model, args.batch_size, args.device, args.iterations)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
