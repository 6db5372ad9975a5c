#!/usr/bin/env bash
# GPU job 6: where MFLG's cost at batch-1 inference goes (the ops' CUPTI external correlation,
# the libraries' NVTX ranges, F itself), with level sets as `xsp run` now configures them (MF
# without op shapes).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 80 python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_native.py::test_gpu_kernel_counts_equal_cuptis_own \
  tests/test_native.py::test_loader_workers_record_nothing_and_batches_say_their_settings 2>&1 \
  | grep -E "^E |assert|passed|failed|Error" | head -20
timeout 420 python3 benchmarks/overhead.py --rounds 3 --iters 50 --cases torchvision:resnet50/infer/1 \
  --configs "none,MF(no shapes),MLG,MFLG,MFLG(no correlation),MFLG(no library ranges),torch.profiler(cpu+cuda)" \
  --out "$OUT/overhead-infer-b1-decomposed.json" 2>&1 | grep -v round
# (run 1 also measured ResNet-50 b64 training here, which left the inference case no time:
# about 15 s per process on the H200, so 21 processes need the 420 s above)
