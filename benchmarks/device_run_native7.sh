#!/usr/bin/env bash
# GPU job 7: the GPT LM and compiled ResNet-18 overhead cases (about 20 s per GPT process and
# 60 s per compiled one on the H200: each xsp process compiles afresh, inductor's caches off).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m compileall -q -j 0 xsp/ tracer/ analysis/ benchmarks/ /tmp/site >/dev/null 2>&1
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
timeout 250 python3 benchmarks/overhead.py --rounds 3 --cases gpt-lm/train/16 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)" --out "$OUT/overhead-gpt-lm.json" 2>&1 | grep -v round
timeout 300 python3 benchmarks/overhead.py --rounds 2 --cases compiled:torchvision:resnet18/train/32 \
  --configs "none,MF(no shapes),MFLG" --out "$OUT/overhead-compiled.json" 2>&1 | grep -v round
