#!/usr/bin/env bash
# GPU job for levels F+L+G in one process: the MFLG fixture, GPU tests, the kernel-count check
# and the leveled acceptance run of issue 3 (ResNet-50 b32 training at M,MF,MFL,MFLG).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 tests/record_fixture.py --device cuda --levels MFLG --out "$OUT/resnet18_train_mflg_cuda.json" 2>&1 | tail -3
python3 - "$OUT/resnet18_train_mflg_cuda.json" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
fw, api = d["framework"], d["api"]
print("F events", len(fw["name"]), "sample", fw["name"][:3], fw["input_shapes"][:3], fw["seq_nr"][:3])
lib = api["library"]
print("library ranges", len(lib["name"]), collections.Counter(zip(lib["domain"], lib["name"])).most_common(6))
print("api", len(api["name"]), "gpu", len(d["gpu"]["name"]))
PY
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -4
python3 benchmarks/gpu_check.py --out "$OUT/gpu-check-mflg.json" 2>&1 | tail -45
python3 -m xsp run --model torchvision:resnet50 --batch-size 32 --mode train --levels M,MF,MFL,MFLG \
    --iterations 5 --warmup 3 --device cuda --out "$OUT/accept-r50-b32" 2>&1 | tail -12
