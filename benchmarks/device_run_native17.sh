#!/usr/bin/env bash
# GPU job 17: after cudaFuncSetAttribute and the occupancy and kernel-lookup queries joined the
# API calls CUPTI is told not to record: the GPU tests and the MFLG correctness check
# (benchmarks/gpu_check.py: kernel counts, every kernel under its launch and op, calls by id).
source "$(dirname "$0")/device_setup.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_gpu.py \
  tests/test_native.py tests/test_compiled.py 2>&1 | grep -E "^E |passed|failed|Error" | head -20
timeout 120 python3 benchmarks/gpu_check.py --out "$OUT/gpu-check.json" 2>&1 | tail -6
