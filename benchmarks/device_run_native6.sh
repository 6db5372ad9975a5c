#!/usr/bin/env bash
# GPU job 6: where MFLG's cost at batch-1 inference goes (shapes, the ops' CUPTI external
# correlation, the libraries' NVTX ranges, F itself), and the ResNet-50 b64 training figures
# with level sets as `xsp run` now configures them (MF without op shapes).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 330 python3 benchmarks/overhead.py --rounds 3 --iters 50 --cases torchvision:resnet50/infer/1 \
  --configs "none,MF(no shapes),MLG,MFLG,MFLG(no shapes),MFLG(no correlation),MFLG(no library ranges),torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-infer-b1-decomposed.json" 2>&1 | grep -v round
timeout 230 python3 benchmarks/overhead.py --rounds 3 --cases torchvision:resnet50/train/64 \
  --configs "none,MF(no shapes),MFLG,MFLG(no library ranges),torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-r50-train-run2.json" 2>&1 | grep -v round
