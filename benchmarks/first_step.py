"""Where a fresh CUDA process's first iteration goes, and what loading libraries first saves.

    python benchmarks/first_step.py [--rounds 3] [--model torchvision:resnet50] [--batch-size 1]

A level-set process pays CUDA's context and its workload's first iteration in full (on the
H200, ResNet-50 b1 inference: 0.33-0.36 s and 0.36-0.46 s, against 4-7 ms for the next step):
cuDNN's and cuBLAS's handles, each kernel's module. Each round starts fresh interpreters,
alternating: one as a level-set process starts today, one whose libraries (cuDNN's engines,
cuBLAS) were loaded before CUDA started, as a fork server could do once for all its children
(it saved nothing: ``results/first-step-h200``). Each prints the seconds of its phases as one
JSON line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r"""
import ctypes, glob, json, os, sys, time
t0 = time.perf_counter()
import torch
from xsp.tracer.workloads import zoo
t_import = time.perf_counter()
preloaded = 0
if sys.argv[1] == "preload":
    # every library of torch's cuDNN and cuBLAS wheels, as dlopen would find them later
    import nvidia
    for root in nvidia.__path__:
        for lib in sorted(glob.glob(os.path.join(root, "**", "lib*.so*"), recursive=True)):
            name = os.path.basename(lib)
            if any(key in name for key in ("cudnn", "cublas")):
                try:
                    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                    preloaded += 1
                except OSError:
                    pass
t_preload = time.perf_counter()
torch.zeros(1, device="cuda")  # CUDA's context
torch.cuda.synchronize()
t_context = time.perf_counter()
workload = zoo.build(sys.argv[2], int(sys.argv[3]), "infer", "cuda")
torch.cuda.synchronize()
t_build = time.perf_counter()
steps = []
for _ in range(4):
    began = time.perf_counter()
    workload.step()
    torch.cuda.synchronize()
    steps.append(round(time.perf_counter() - began, 4))
print(json.dumps({"mode": sys.argv[1], "preloaded": preloaded, "import_s": round(t_import - t0, 3),
    "preload_s": round(t_preload - t_import, 3), "context_s": round(t_context - t_preload, 3),
    "build_s": round(t_build - t_context, 3),
    "steps_s": steps}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("first_step.py: no CUDA GPU here (it times a CUDA process's first step)")
    for _ in range(args.rounds):
        for mode in ("plain", "preload"):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, mode, args.model, str(args.batch_size)],
                capture_output=True,
                text=True,
            )
            print(done.stdout.strip() or done.stderr[-500:], flush=True)


if __name__ == "__main__":
    main()
