#!/usr/bin/env bash
# GPU job 4 for the native capture core: the per-step, end-to-end and RSS figures with
# the nn.Module.__call__ wrapper, where op shapes and the F+L correlation cost go, and the
# batch-1 inference cases.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 250 python3 benchmarks/overhead.py --rounds 3 --cases torchvision:resnet50/train/64 \
  --configs "none,MF,MF(no shapes),MFL,MFLG,torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-r50-train.json" 2>&1 | grep -v round
timeout 300 python3 benchmarks/overhead.py --rounds 3 --iters 50 \
  --cases torchvision:resnet50/infer/1,torchvision:mobilenet_v2/infer/1 \
  --configs "none,MF,MF(no shapes),MFLG,torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-infer-b1.json" 2>&1 | grep -v round
