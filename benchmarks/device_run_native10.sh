#!/usr/bin/env bash
# GPU job 10: GPU tests after the conversion changes; batch-1 inference and the GPT LM with the
# paired step ratio; what the libraries' NVTX ranges cost ResNet-50 b64 training.
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
run 150 r50-infer-b1 --rounds 3 --iters 30 --cases torchvision:resnet50/infer/1 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
run 140 mobilenet-b1 --rounds 3 --iters 30 --cases torchvision:mobilenet_v2/infer/1 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
run 80 r50-train-libranges --rounds 1 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "MFLG,MFLG(no library ranges),MFLG(no shapes)"
run 105 gpt-lm --rounds 2 --iters 30 --cases gpt-lm/train/16 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
