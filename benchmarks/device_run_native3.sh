#!/usr/bin/env bash
# GPU job 3 for the native capture core: the GPU tests after the allocator events and the
# deferred finish, and a ResNet-50 b64 training measurement's memory analyses (A4, A7) on CUDA.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_native.py -k "gpu or GPU or cuda" 2>&1 | tail -3
python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MF,MFLG \
  --iterations 3 --warmup 2 --device cuda --out /tmp/r50m 2>&1 | tail -4
python3 - /tmp/r50m "$OUT/memory-r50-b64-train.json" <<'PY'
import json, sys
from xsp.analysis.store import MeasurementStore
from xsp.analysis import memory
store = MeasurementStore(sys.argv[1])
runs = {r.levels: r.meta for r in store.runs}
layers = memory.layer_memory(store).to_pylist()
types = memory.layer_type_memory(store).to_pylist()
out = {"status": {k: (m["status"], m.get("memory_events"), m.get("api_ops")) for k, m in runs.items()},
       "layer_memory_top": layers[:8], "layer_type_memory": types, "layers": len(layers)}
json.dump(out, open(sys.argv[2], "w"), indent=1, default=str)
print(json.dumps(out["status"]), len(layers), "layers")
for row in types[:6]:
    print(row["layer_type"], row["device"], row["allocations_per_iteration"], row["allocated_bytes_per_iteration"], row["peak_allocated_bytes"])
PY
