#!/usr/bin/env bash
# One batched job for the GPU machine: sanity, CUDA fixture, an xsp run, the overhead benchmark.
# Run from the repo root on the device with .whl carried; results land in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
[ -n "${FIXTURE:-}" ] && python3 tests/record_fixture.py --device cuda --model torchvision:resnet18 --mode train --batch-size 2 \
    --out "$OUT/resnet18_train_cuda.json"
python3 -m xsp run --model torchvision:resnet50 --batch-size 32 --mode train --levels M,MF \
    --iterations 5 --warmup 3 --device cuda --out /tmp/R50 && python3 -m xsp export /tmp/R50 -o "$OUT/r50_train_b32.jsonl" \
    && gzip -f "$OUT/r50_train_b32.jsonl"
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5
python3 benchmarks/overhead.py --rounds ${ROUNDS:-7} --iters ${ITERS:-30} --out "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt"
