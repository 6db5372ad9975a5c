#!/usr/bin/env bash
# GPU job 9: the issue-14 figures with the paired (same-process) step ratio, after the finish
# no longer imports pandas; bytecode compiled first, as an installed package has it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
env | grep -E "^PYTHON(DONTWRITE|PYCACHE)" ; python3 -m compileall -q -j 0 xsp/ /tmp/site >/dev/null 2>&1
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 230 python3 benchmarks/overhead.py --rounds 3 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-r50-train.json" 2>&1 | grep -v round
timeout 170 python3 benchmarks/overhead.py --rounds 3 --iters 50 --cases torchvision:resnet50/infer/1 \
  --configs "none,MF(no shapes),MFLG,MFLG(no correlation),torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-r50-infer-b1.json" 2>&1 | grep -v round
timeout 130 python3 benchmarks/overhead.py --rounds 3 --iters 50 --cases torchvision:mobilenet_v2/infer/1 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-mobilenet-b1.json" 2>&1 | grep -v round
