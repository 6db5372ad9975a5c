#!/usr/bin/env bash
# GPU job 11: MFLG with op shapes from the first measured iteration only (the default since job
# 10), against shapes in every iteration and torch.profiler; the GPU tests. About 9 minutes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m compileall -q -j 0 xsp/ tracer/ analysis/ benchmarks/ /tmp/site >/dev/null 2>&1
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 70 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_gpu.py \
  tests/test_native.py::test_gpu_kernel_counts_equal_cuptis_own 2>&1 \
  | grep -E "^E |assert|passed|failed|Error" | head -20
run() {  # seconds, name, overhead.py arguments...
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 benchmarks/overhead.py --out "$OUT/overhead-$name.json" "$@" 2>&1 | grep -v round
}
run 300 r50-train --rounds 3 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "none,MF(no shapes),MFLG,MFLG(shapes every iteration),torch.profiler(cpu+cuda)"
run 150 r50-infer-b1 --rounds 3 --iters 30 --cases torchvision:resnet50/infer/1 \
  --configs "none,MFLG,MFLG(no library ranges),torch.profiler(cpu+cuda)"
