#!/usr/bin/env bash
# GPU job: overhead of MLG/MFLG with bookkeeping API calls left out, and the leveled stores for
# the reconstruction acceptance (ResNet-50 b64 training, 20 iterations, M,MF,MFL,MFLG) and the
# layout suggestion (the same model in channels_last). Stores come back as tarballs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MF,MFL,MFLG \
    --iterations 20 --warmup 3 --device cuda --out /tmp/r50 2>&1 | tail -9
python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MFLG \
    --iterations 5 --warmup 3 --device cuda --channels-last --out /tmp/r50cl 2>&1 | tail -3
tar -C /tmp -czf "$OUT/r50-b64-train.tgz" r50 r50cl
python3 benchmarks/overhead.py --rounds ${ROUNDS:-3} --iters ${ITERS:-20} --configs "none,MLG,MFLG" \
    --out "$OUT/overhead-mflg-quiet.json" 2>&1 | grep -v "^WARNING" | tail -16
