#!/usr/bin/env bash
# GPU job for the native capture core: build it, record the native fixtures, check kernel counts
# and parents against CUPTI alone (ResNet-50 MFLG), the GPU tests, the end-to-end cost of a
# 30-iteration MFLG run against the untraced loop, and a crash: a run killed mid-way.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
/usr/bin/time -f "native build %e s" python3 -c "
from xsp.tracer.native.build import load; m = load(); print('with CUPTI', m.WITH_CUPTI)" 2>&1 | tail -3
for levels in MF MFLG; do
  python3 tests/record_fixture.py --device cuda --levels $levels --iterations 1 \
    --out "$OUT/fixtures/resnet18_train_${levels,,}_cuda_native/raw.json" 2>&1 | tail -2
done
python3 benchmarks/gpu_check.py --out "$OUT/gpu-check-native.json" 2>&1 | tail -60
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_native.py 2>&1 | tail -4
python3 benchmarks/overhead.py --rounds 3 --cases torchvision:resnet50/train/64 --configs none,MF,MFLG,"torch.profiler(cpu+cuda)" --out "$OUT/overhead-r50-train.json" 2>&1 | tail -12
