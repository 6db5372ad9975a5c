#!/usr/bin/env bash
# GPU job 2 for the native capture core: where MFLG's step cost goes (level sets and CUPTI buffer
# sizes on ResNet-50 training), a profile of the MFLG finish, the batch-1 inference cases, and
# the GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_native.py 2>&1 | tail -3
python3 - "$OUT/finish-profile.txt" <<'PY' 2>&1 | tail -3
import cProfile, io, os, pstats, sys, tempfile
from xsp.tracer.capture.cupti import nvtx_environment
os.environ.update(nvtx_environment())
from xsp.tracer.capture.session import Session
from xsp.tracer.workloads import zoo
w = zoo.build("torchvision:resnet50", 64, "train", "cuda")
s = Session("MFLG", iterations=30, warmup=10, out=tempfile.mkdtemp() + "/r", device="cuda").start()
while not s.done:
    with s.iteration():
        w.step()
pr = cProfile.Profile(); pr.enable(); meta = s.close(); pr.disable()
text = io.StringIO(); pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats(45)
open(sys.argv[1], "w").write(text.getvalue())
print("finish profile written;", meta["spans"], "spans")
PY
python3 benchmarks/overhead.py --rounds 3 --cases torchvision:resnet50/train/64 \
  --configs none,MF,MFL,MLG,MFLG,"MFLG(cupti 16MB)" --out "$OUT/overhead-r50-train-levels.json" 2>&1 | tail -9
python3 benchmarks/overhead.py --rounds 3 --cases torchvision:resnet50/infer/1,torchvision:mobilenet_v2/infer/1 \
  --out "$OUT/overhead-infer-b1.json" 2>&1 | grep -v round
