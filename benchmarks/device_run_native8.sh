#!/usr/bin/env bash
# GPU job 8: what CUPTI external correlation costs per op, by activity kinds; the kernel-count
# test with its reference counting every kernel CUPTI saw.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 120 python3 benchmarks/correlation_cost.py --ops 20000 --out "$OUT/correlation-cost.json" 2>&1 | tail -20
timeout 80 python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_native.py::test_gpu_kernel_counts_equal_cuptis_own 2>&1 \
  | grep -E "^E |assert|passed|failed|Error" | head -20
