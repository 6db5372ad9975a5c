#!/usr/bin/env bash
# GPU job 5: the GPU tests, compiled models (Triton kernels to their modules), and CUPTI's own
# kernel count. (Run 1 killed the tests at 150 s, before the last; the overhead cases it also
# ran had too little time and moved to device_run_native7.sh.)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_native.py \
  tests/test_compiled.py 2>&1 | tail -4
timeout 120 python3 benchmarks/compiled_attribution.py --out "$OUT/compiled-attribution.json" \
  2>&1 | sed -n '/"model"/,/"examples"/p'
timeout 90 python3 benchmarks/gpu_check.py --out "$OUT/gpu-check.json" 2>&1 | tail -4
