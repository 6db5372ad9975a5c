#!/usr/bin/env bash
# GPU job for levels L and G: CUDA fixtures, GPU tests, the kernel-count check, an xsp run,
# and the overhead of M, MF and MLG.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 tests/record_fixture.py --device cuda --levels MLG --out "$OUT/resnet18_train_mlg_cuda.json" 2>&1 | tail -1
python3 tests/record_fixture.py --device cuda --levels MF --out "$OUT/resnet18_train_mf_cuda.json" 2>&1 | tail -1
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -4
python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json" 2>&1 | tail -30
python3 -m xsp run --model torchvision:resnet50 --batch-size 32 --mode train --levels M,MF,MLG \
    --iterations 3 --warmup 2 --device cuda --out /tmp/R 2>&1 | tail -9
# CUPTI and the PyTorch profiler cannot meet in one process: MLG is measured in its own.
python3 benchmarks/overhead.py --rounds ${ROUNDS:-5} --iters ${ITERS:-20} --configs "none,M,MLG" \
    --out "$OUT/overhead-mlg.json" 2>&1 | tee "$OUT/overhead-mlg.txt" | tail -18
python3 benchmarks/overhead.py --rounds ${ROUNDS:-5} --iters ${ITERS:-20} \
    --configs "none,MF,torch.profiler(cpu),torch.profiler(cpu+cuda)" \
    --out "$OUT/overhead-mf.json" 2>&1 | tee "$OUT/overhead-mf.txt" | tail -18
